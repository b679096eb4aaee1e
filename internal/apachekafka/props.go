package apachekafka

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// BrokerProps returns the settings every node of a cluster of the given
// size shares, before its own node.id, listeners, quorum voters and log
// dir. They suit tests: internal topics and new topics get replication
// factor min(nodes, 3) and, from three nodes, min.insync.replicas=2 (as in
// production); the first group rebalance starts at once; classic groups
// accept session timeouts from 1 s and KIP-848 groups heartbeat every
// 500 ms with a 6 s session timeout (the broker's defaults, 45 s and 5 s,
// would make every takeover in a test last a minute).
func BrokerProps(nodes int, autoCreateTopics bool) map[string]string {
	rf := min(max(nodes, 1), 3)
	minISR := 1
	if rf >= 3 {
		minISR = 2
	}
	return map[string]string{
		"process.roles":                                    "broker,controller",
		"controller.listener.names":                        "CONTROLLER",
		"inter.broker.listener.name":                       "PLAINTEXT",
		"listener.security.protocol.map":                   "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"auto.create.topics.enable":                        strconv.FormatBool(autoCreateTopics),
		"num.partitions":                                   "1",
		"default.replication.factor":                       strconv.Itoa(rf),
		"min.insync.replicas":                              strconv.Itoa(minISR),
		"offsets.topic.replication.factor":                 strconv.Itoa(rf),
		"transaction.state.log.replication.factor":         strconv.Itoa(rf),
		"transaction.state.log.min.isr":                    strconv.Itoa(minISR),
		"share.coordinator.state.topic.replication.factor": strconv.Itoa(rf),
		"share.coordinator.state.topic.min.isr":            strconv.Itoa(minISR),
		"group.initial.rebalance.delay.ms":                 "0",
		"group.min.session.timeout.ms":                     "1000",
		"group.consumer.min.session.timeout.ms":            "1000",
		"group.consumer.session.timeout.ms":                "6000",
		"group.consumer.min.heartbeat.interval.ms":         "100",
		"group.consumer.heartbeat.interval.ms":             "500",
		"unclean.leader.election.enable":                   "false",
	}
}

// formatProps renders props as a Java properties file, keys sorted.
func formatProps(props map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(props)) {
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	return b.String()
}

// log4jConfig returns a log4j2 configuration that writes every broker log
// line of level INFO and above to logFile.
func log4jConfig(logFile string) string {
	return `status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = ` + logFile + `
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
`
}
