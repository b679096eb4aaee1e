package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// phaseCPU is the CPU time a phase took: this process's (the framework,
// the drivers and, with the embedded servers in this process, mongofake
// and kfake) and, when this run started the Kafka broker, the broker's
// JVM's. On a machine shared with other work, CPU time says where a
// phase's work went when its wall-clock figures differ between Kafkas.
type phaseCPU struct {
	ProcessSeconds float64 `json:"process_cpu_s"`
	// BrokerSeconds is absent when the broker is not a process this run
	// started (kfake in this process or a child, -kafka-brokers).
	BrokerSeconds *float64 `json:"broker_cpu_s,omitempty"`
}

// userHZ is the unit of the CPU times of /proc/PID/stat: the kernel
// reports them in USER_HZ ticks, 100 per second on every Linux ABI.
const userHZ = 100

// procCPUSeconds returns the user and system CPU time process pid has
// used (every thread), from /proc; ok is false where /proc has no such
// figure.
func procCPUSeconds(pid string) (float64, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// the fields that follow start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return float64(u+st) / userHZ, true
}

// cpuMeter reads the CPU time of this process and of the broker's JVM
// (brokerPid 0: none).
type cpuMeter struct{ brokerPid int }

// sample is one reading of a cpuMeter.
type sample struct {
	process, broker float64
	hasBroker       bool
}

func (m cpuMeter) read() sample {
	var s sample
	s.process, _ = procCPUSeconds("self")
	if m.brokerPid > 0 {
		s.broker, s.hasBroker = procCPUSeconds(fmt.Sprint(m.brokerPid))
	}
	return s
}

// since is the CPU time used from start to now.
func (m cpuMeter) since(start sample) phaseCPU {
	now := m.read()
	c := phaseCPU{ProcessSeconds: now.process - start.process}
	if start.hasBroker && now.hasBroker {
		b := now.broker - start.broker
		c.BrokerSeconds = &b
	}
	return c
}
