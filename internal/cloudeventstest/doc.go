// Package cloudeventstest checks the framework's CloudEvents records
// against the official CloudEvents SDK for Go and its Kafka binding. It is
// a module of its own so that the SDK (and the Sarama client its Kafka
// binding is written for) never become dependencies of the framework.
package cloudeventstest
