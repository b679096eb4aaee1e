package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// metrics is a replica's OpenTelemetry SDK meter provider, read by the
// Prometheus exporter at every scrape of GET /metrics. The framework only
// uses the OpenTelemetry API (Config.MeterProvider); the SDK and the
// exporter are the service's choice, made here.
type metrics struct {
	provider *sdkmetric.MeterProvider
	handler  http.Handler
}

// newMetrics builds the provider and the /metrics handler. Each replica has
// its own Prometheus registry, so replicas running in one process (-replicas
// N) each report their own clients, like separate processes would. The
// registry also carries the Go runtime and process collectors. A scrape
// serves what could be collected even when a part failed (a storage gauge
// while MongoDB is unreachable, say).
func newMetrics() (*metrics, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("prometheus go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("prometheus process collector: %w", err)
	}
	// The resource shows as target_info{service_name="outbox-example", ...}.
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(attribute.String("service.name", "outbox-example")))
	if err != nil {
		return nil, fmt.Errorf("metrics resource: %w", err)
	}
	return &metrics{
		provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}),
	}, nil
}

// forService returns the provider to pass as Config.MeterProvider of one
// bounded context. Both contexts share the provider and the instrument
// names, so each gets its meter with an instrumentation-scope attribute
// "service": the exporter turns it into the label otel_scope_service, and
// the two contexts' series stay apart (their gauges would otherwise
// overwrite each other).
func (m *metrics) forService(service string) metric.MeterProvider {
	return scopedMeterProvider{MeterProvider: m.provider, service: service}
}

// shutdown releases the provider; GET /metrics answers with no framework
// metrics afterwards.
func (m *metrics) shutdown(ctx context.Context) error {
	return m.provider.Shutdown(ctx)
}

// scopedMeterProvider adds the service attribute to every meter's
// instrumentation scope.
type scopedMeterProvider struct {
	metric.MeterProvider
	service string
}

// Meter returns the underlying provider's meter for name, with the service
// attribute in its scope.
func (p scopedMeterProvider) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	opts = append(opts[:len(opts):len(opts)],
		metric.WithInstrumentationAttributes(attribute.String("service", p.service)))
	return p.MeterProvider.Meter(name, opts...)
}
