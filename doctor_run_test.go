package outbox

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/event-outbox/outbox/internal/doctor"
	itel "github.com/event-outbox/outbox/internal/telemetry"
	"github.com/event-outbox/outbox/internal/testkit"
)

// TestRunReportsBreakingSettings: a service started on a compacted topic
// runs (it is not refused), logs the finding once as a warning with its
// fix, and reports it in Status and the metric outbox.doctor.findings.
func TestRunReportsBreakingSettings(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.kafka.SetTopicConfig(t, b.kafkaTopic(ordersTopic), "cleanup.policy", kadm.StringPtr("compact"))

	var logs testkit.Buffer
	cfg := b.config("run-doctor")
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	require.NoError(t, Handle(c, func(context.Context, orderPlaced, Metadata) error { return nil }))
	start(t, c)

	var st Status
	var err error
	eventually(t, "the doctor's report in Status", func() bool {
		st, err = c.Status(ctx)
		require.NoError(t, err)
		return st.Doctor != nil
	})
	require.True(t, st.Running, "the findings do not stop Run")
	f := findingWith(*st.Doctor, "kafka.cleanup_policy", "cleanup.policy=compact")
	require.NotNil(t, f, dump(*st.Doctor))
	require.Equal(t, SeverityBreaks, f.Severity)

	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "check=kafka.cleanup_policy"), out)
	require.Contains(t, out, "level=WARN")
	require.Contains(t, out, `fix="set cleanup.policy=delete"`)
	require.Contains(t, out, "doctor: 1 breaks a guarantee")

	m := o.collect(t)
	require.Equal(t, 1.0, sumOf(m["outbox.doctor.findings"], itel.AttrSeverity.String("breaks")))

	raw, err := st.MarshalJSON()
	require.NoError(t, err)
	require.Contains(t, string(raw), `"check":"kafka.cleanup_policy"`)
	require.Contains(t, string(raw), `"severity":"breaks"`)
}

// TestDoctorSeverities: Admin.Doctor converts the doctor's severities by
// value, so both orders must agree.
func TestDoctorSeverities(t *testing.T) {
	t.Parallel()
	require.Equal(t, []Severity{SeverityNote, SeverityRisk, SeverityBreaks},
		[]Severity{Severity(doctor.SeverityNote), Severity(doctor.SeverityRisk), Severity(doctor.SeverityBreaks)})
}
