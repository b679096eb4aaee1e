package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox"
)

// routes is the replica's HTTP API:
//
//	POST /orders                      {"customer": "ada", "amount": 42} -> 201 order
//	POST /orders?fail_after_write=1   writes, then aborts -> 500, nothing stored
//	GET  /orders/{id}                 -> 200 order, 404 unknown
//	GET  /outbox/status               -> both contexts' outbox.Status (owned partitions, pending, failed
//	                                     and parked counts, oldest pending age) and totals; 503 when
//	                                     MongoDB cannot be read
//	GET  /outbox/status/orders        -> the orders client's Client.StatusHandler
//	GET  /outbox/status/payments      -> the payments client's Client.StatusHandler
//	GET  /outbox/parked               -> parked events per context
//	GET  /metrics                     -> the framework's metrics (both contexts), Go runtime and process
//	                                     metrics, in Prometheus text format
//	GET  /healthz                     -> 200 when MongoDB answers
//	GET  /outbox/ui/                  -> the operations console of both contexts (package console);
//	                                     read-only unless OUTBOX_CONSOLE_PASSWORD is set
//	GET  /outbox/charges              -> whether every order was charged exactly once
//
// Every error, including 404 for an unknown path and 405 for a wrong
// method, is JSON: {"error": "..."}.
func (r *replica) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", r.createOrder)
	mux.HandleFunc("GET /orders/{id}", r.getOrder)
	mux.HandleFunc("GET /outbox/status", r.outboxStatus)
	for name, c := range r.clients() {
		mux.Handle("GET /outbox/status/"+name, c.StatusHandler())
	}
	mux.HandleFunc("GET /outbox/parked", r.parked)
	mux.Handle("GET /metrics", r.metrics.handler)
	mux.HandleFunc("GET /healthz", r.healthz)
	mux.Handle("/outbox/ui/", http.StripPrefix("/outbox/ui", r.console))
	mux.HandleFunc("GET /outbox/charges", r.charges)
	return jsonErrors(mux)
}

// maxBody caps request bodies.
const maxBody = 64 << 10

type createOrderRequest struct {
	Customer string       `json:"customer"`
	Amount   *wholeNumber `json:"amount"`
}

// maxIdempotencyKey caps the Idempotency-Key header.
const maxIdempotencyKey = 200

func (r *replica) createOrder(w http.ResponseWriter, req *http.Request) {
	var opts orderOptions
	tooLarge := false
	for name, v := range map[string]*bool{"fail_after_write": &opts.failAfterWrite, "poison": &opts.poison, "too_large": &tooLarge} {
		if s := req.URL.Query().Get(name); s != "" {
			b, err := strconv.ParseBool(s)
			if err != nil {
				writeError(w, http.StatusBadRequest, "%s must be true or false, got %q", name, s)
				return
			}
			*v = b
		}
	}
	opts.idempotencyKey = strings.TrimSpace(req.Header.Get("Idempotency-Key"))
	if len(opts.idempotencyKey) > maxIdempotencyKey {
		writeError(w, http.StatusBadRequest, "Idempotency-Key is longer than %d bytes", maxIdempotencyKey)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		writeError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json, got %q", ct)
		return
	}
	var body createOrderRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			writeError(w, http.StatusRequestEntityTooLarge, "request body larger than %d bytes", maxBody)
		case errors.Is(err, io.EOF):
			writeError(w, http.StatusBadRequest, `empty body: want {"customer": "...", "amount": 42}`)
		default:
			writeError(w, http.StatusBadRequest, "%s", bodyError(err))
		}
		return
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "invalid JSON body: more than one value")
		return
	}
	body.Customer = strings.TrimSpace(body.Customer)
	switch {
	case body.Customer == "":
		writeError(w, http.StatusBadRequest, "customer is required")
		return
	case len(body.Customer) > 200:
		writeError(w, http.StatusBadRequest, "customer is longer than 200 bytes")
		return
	case body.Amount == nil:
		writeError(w, http.StatusBadRequest, "amount is required")
		return
	case *body.Amount <= 0:
		writeError(w, http.StatusBadRequest, "amount must be a positive whole number, got %d", *body.Amount)
		return
	}

	if tooLarge {
		r.createRefusedOrder(w, req, body.Customer, int64(*body.Amount), opts)
		return
	}
	o, replayed, err := r.orders.Create(req.Context(), body.Customer, int64(*body.Amount), opts)
	switch {
	case errors.Is(err, errAbortedOnPurpose):
		writeJSON(w, http.StatusInternalServerError, map[string]any{
			"error":    err.Error(),
			"order_id": o.ID,
			"note":     "the transaction was aborted: GET /orders/" + o.ID + " answers 404 and no OrderCreated was published",
		})
	case errors.Is(err, errKeyReused):
		writeError(w, http.StatusUnprocessableEntity, "%v (order %s, customer %q, amount %d)", err, o.ID, o.Customer, o.Amount)
	case errors.Is(err, outbox.ErrInvalidEvent):
		writeError(w, http.StatusBadRequest, "%v", err)
	case err != nil:
		r.unavailable(w, req, "create the order", err)
	case replayed:
		// The same request again (a client retry): the order it created.
		w.Header().Set("Location", "/orders/"+o.ID)
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, o)
	default:
		w.Header().Set("Location", "/orders/"+o.ID)
		writeJSON(w, http.StatusCreated, o)
	}
}

// unavailable answers 503 for a request that could not reach MongoDB or
// Kafka, in words an operator can act on, within the request's deadline
// (requestTimeout).
func (r *replica) unavailable(w http.ResponseWriter, req *http.Request, what string, err error) {
	r.log.ErrorContext(req.Context(), what, "err", err)
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || mongo.IsTimeout(err):
		writeError(w, http.StatusServiceUnavailable, "could not %s: MongoDB did not answer within %v (is it down?): %v", what, requestTimeout, err)
	case errors.Is(err, outbox.ErrPartitionsUnknown):
		writeError(w, http.StatusServiceUnavailable, "could not %s: Kafka has not answered since this service first started, so the topics' partition counts are unknown; retry once GET /readyz answers 200: %v", what, err)
	default:
		writeError(w, http.StatusServiceUnavailable, "could not %s: %v", what, err)
	}
}

func (r *replica) getOrder(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	o, err := r.orders.Get(req.Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, "order %q not found", id)
	case err != nil:
		r.unavailable(w, req, "read the order", err)
	default:
		writeJSON(w, http.StatusOK, o)
	}
}

func (r *replica) outboxStatus(w http.ResponseWriter, req *http.Request) {
	st, err := r.status(req.Context())
	code := http.StatusOK
	if err != nil {
		r.log.Warn("outbox status", "err", err)
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, code, st)
}

func (r *replica) parked(w http.ResponseWriter, req *http.Request) {
	out := map[string][]outbox.ParkedEvent{}
	for name, c := range r.clients() {
		evs, err := c.Admin().ParkedEvents(req.Context(), outbox.ParkedFilter{Limit: 100})
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "could not list parked events: %v", err)
			return
		}
		out[name] = evs
	}
	writeJSON(w, http.StatusOK, out)
}

func (r *replica) healthz(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second)
	defer cancel()
	if err := r.stack.mongo.Ping(ctx, nil); err != nil {
		writeError(w, http.StatusServiceUnavailable, "MongoDB: %v", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "replica": r.name})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, format string, args ...any) {
	writeJSON(w, code, map[string]string{"error": fmt.Sprintf(format, args...)})
}
