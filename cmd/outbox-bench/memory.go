package main

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"

	outbox "github.com/event-outbox/outbox"
)

// memoryResult is the outcome of the memory phase. Figures are of this
// process: with -servers inproc it includes the embedded MongoDB server
// (holding the backlog) and kfake (holding the published records); with
// -servers subprocess or real servers it is the framework and the drivers
// alone.
type memoryResult struct {
	Events int `json:"events"`
	// Servers says where the servers ran: inproc, subprocess or real.
	Servers string `json:"servers"`
	// BaselineHeapMB is the heap in use after the backlog was recorded and
	// a GC, before publishing started.
	BaselineHeapMB float64 `json:"baseline_heap_mb"`
	// PeakHeapMB is the peak heap in use (Go heap spans in use: live
	// objects, garbage not yet collected and fragmentation) while
	// publishing, sampled every 10 ms.
	PeakHeapMB float64 `json:"peak_heap_mb"`
	// PeakGrowthMB is PeakHeapMB - BaselineHeapMB.
	PeakGrowthMB float64 `json:"peak_growth_mb"`
	// PeakRSSMB is the process's peak resident set size while publishing
	// (VmHWM, reset before publishing), when the OS reports it.
	PeakRSSMB float64 `json:"peak_rss_mb,omitempty"`
	Rate      float64 `json:"events_per_s"`
}

var heapSamples = []metrics.Sample{
	{Name: "/memory/classes/heap/objects:bytes"},
	{Name: "/memory/classes/heap/unused:bytes"},
}

func heapInUse() uint64 {
	metrics.Read(heapSamples)
	return heapSamples[0].Value.Uint64() + heapSamples[1].Value.Uint64()
}

// sampler records the peak heap in use until stopped.
type sampler struct {
	stop chan struct{}
	wg   sync.WaitGroup
	peak uint64
}

func startSampler() *sampler {
	s := &sampler{stop: make(chan struct{})}
	s.wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			s.peak = max(s.peak, heapInUse())
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	})
	return s
}

func (s *sampler) finish() uint64 {
	close(s.stop)
	s.wg.Wait()
	return max(s.peak, heapInUse())
}

// resetPeakRSS asks Linux to reset VmHWM; it reports whether it could.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// peakRSS reads VmHWM in bytes, or 0.
func peakRSS() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

const mb = 1 << 20

// runMemory publishes a backlog of n events and samples memory.
func runMemory(ctx context.Context, e *env, n int) (memoryResult, error) {
	var s *sampler
	var base uint64
	rssOK := false
	res, err := runRelay(ctx, e, n, topics.memory, "memory", func(i int) outbox.Event {
		return memoryEvent{newPayload(i, e.opts.eventSize)}
	}, func() {
		runtime.GC()
		base = heapInUse()
		rssOK = resetPeakRSS()
		s = startSampler()
	})
	if s == nil {
		return memoryResult{}, err
	}
	peak := s.finish()
	if err != nil {
		return memoryResult{}, err
	}
	servers := e.opts.servers
	if e.opts.mongoURI != "" && e.opts.brokers != "" {
		servers = "real"
	}
	out := memoryResult{
		Events: n, Servers: servers,
		BaselineHeapMB: float64(base) / mb, PeakHeapMB: float64(peak) / mb,
		PeakGrowthMB: (float64(peak) - float64(base)) / mb,
		Rate:         res.Rate,
	}
	if rssOK {
		out.PeakRSSMB = float64(peakRSS()) / mb
	}
	return out, nil
}
