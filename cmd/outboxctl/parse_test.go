package main

import (
	"errors"
	"flag"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// parseEnv is an environment with a URI and a database, so that parse
// judges the flags under test.
func parseEnv(k string) string {
	return map[string]string{"MONGODB_URI": "mongodb://127.0.0.1:1/", "OUTBOX_DB": "shop"}[k]
}

// Values that would act with surprising results are usage errors (exit
// 2) naming the flag: no deadline, a time in the future, a negative
// outage, a topic given two partition counts, an empty collection name.
func TestParseRefusesSurprisingValues(t *testing.T) {
	t.Parallel()
	for flagName, args := range map[string][]string{
		"-timeout":         {"status", "-timeout", "0"},
		"-timeout ":        {"status", "-timeout", "-1s"},
		"-before":          {"parked", "list", "-before", "-24h"},
		"-outage":          {"doctor", "-outage", "-1h"},
		"-handler-timeout": {"doctor", "-handler-timeout", "-1s"},
		"-partitions":      {"migrate", "event-outbox", "-partitions", "orders=3,orders=4"},
		"-outbox":          {"status", "-outbox", ""},
		"-inbox":           {"status", "-inbox", " "},
	} {
		_, err := parse(args, io.Discard, parseEnv)
		var usage *usageError
		require.ErrorAs(t, err, &usage, "%v", args)
		require.ErrorContains(t, err, strings.TrimSpace(flagName))
		require.Equal(t, exitUsage, run(t.Context(), args, io.Discard, io.Discard, parseEnv), "%v", args)
	}
	_, err := parse([]string{"parked", "list", "-before", "24h", "-partitions", "orders=3,payments=4", "-timeout", "1s"}, io.Discard, parseEnv)
	require.NoError(t, err)
}

// flagName finds the flags an error names. The flag package echoes an
// unknown flag's name as given, which may be any character, blank ones
// included ("flag provided but not defined: -\f").
var flagName = regexp.MustCompile(`-\S|^flag provided but not defined: -`)

// FuzzParse: whatever the command line holds, parse never panics, and
// every usage error names the flag it is about (or says what is missing).
func FuzzParse(f *testing.F) {
	f.Add("status -timeout 0")
	f.Add("parked list -before -24h -limit 5")
	f.Add("doctor -outage -1h -handler-timeout 3s")
	f.Add("migrate event-outbox -partitions orders=3,orders=4")
	f.Add("status -outbox  -inbox x")
	f.Add("parked purge -all -- -x")
	f.Add("-before 2026-01-02T03:04:05Z parked list")
	f.Add("status -limit -1 -json=maybe")
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Split(line, " ")
		o, err := parse(args, io.Discard, parseEnv)
		if err == nil {
			require.NotNil(t, o)
			return
		}
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		var usage *usageError
		require.ErrorAs(t, err, &usage)
		msg := err.Error()
		if msg == "no command" {
			return
		}
		require.True(t, flagName.MatchString(msg), "names no flag: %q", msg)
	})
}
