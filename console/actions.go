package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
)

// Actions.
//
// An action is a POST of a form: svc, csrf, scope ("ids" with one or more
// id fields, or "all" with the parked page's filters), and confirm. Without
// confirm=yes nothing changes: the console answers with the number of
// events the action would change (the dry-run count outboxctl prints) and
// a form to confirm. With confirm=yes it acts and reports how many events
// changed. Every action is an outbox.Admin method: RequestRedrive,
// PurgeParked, RetryFailed, DiscardFailed.

type actionKind int

const (
	actRedrive actionKind = iota
	actPurge
	actRetry
	actDiscard
)

var actionNames = map[actionKind]struct{ path, verb, done string }{
	actRedrive: {"redrive", "Re-drive", "re-drive requested for"},
	actPurge:   {"purge", "Purge", "purged"},
	actRetry:   {"retry", "Retry", "retried"},
	actDiscard: {"discard", "Discard", "discarded"},
}

// actionPage is the confirmation and result pages' data.
type actionPage struct {
	Verb, Path, Done string
	Count            int64
	Confirmed        bool
	Fields           []field
	Back             string
	Parked           bool
}

type field struct{ Name, Value string }

func (c *Console) action(kind actionKind) http.HandlerFunc {
	names := actionNames[kind]
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s, operator, ok := c.actionOf(w, r, 8<<20)
		if !ok {
			return
		}
		var err error
		confirmed := r.PostFormValue("confirm") == "yes"
		ctx, cancel := c.ctx(r)
		defer cancel()
		p := actionPage{Verb: names.verb, Path: names.path, Done: names.done, Confirmed: confirmed,
			Parked: kind == actRedrive || kind == actPurge}
		for k, vs := range r.PostForm {
			if k == csrfField || k == "confirm" {
				continue
			}
			for _, v := range vs {
				p.Fields = append(p.Fields, field{k, v})
			}
		}
		back := url.Values{"svc": {s.Name}}
		if p.Parked {
			for _, k := range []string{"topic", "schema", "key", "before", "after", "view"} {
				if v := r.PostFormValue(k); v != "" {
					back.Set(k, v)
				}
			}
			p.Back = "parked?" + back.Encode()
			p.Count, err = c.parkedAction(ctx, s, kind, r, !confirmed)
		} else {
			if v := r.PostFormValue("topic"); v != "" {
				back.Set("topic", v)
			}
			p.Back = "failed?" + back.Encode()
			p.Count, err = c.failedAction(ctx, s, kind, r, !confirmed)
		}
		if errors.Is(err, outbox.ErrNotParked) {
			err = nil // a stale page: nothing to do, and the count says so
		}
		var bad badRequest
		switch {
		case errors.As(err, &bad):
			c.fail(w, r, http.StatusBadRequest, err)
			return
		case errors.Is(err, outbox.ErrNotRedrivable):
			// A malformed record that can never be re-driven: the message
			// says to purge it.
			c.fail(w, r, http.StatusConflict, err)
			return
		case err != nil:
			c.fail(w, r, http.StatusInternalServerError, err)
			return
		}
		if confirmed {
			c.opts.Logger.Info("console: action", "action", names.path, "service", s.Name, "events", p.Count, "operator", operator)
		}
		c.render(w, r, "action", s, p, start)
	}
}

// actionOf reads an action's form (at most limit bytes) and checks its
// CSRF token and its operator, and returns the service it names and the
// operator; when one of them fails it answers the request and ok is false.
func (c *Console) actionOf(w http.ResponseWriter, r *http.Request, limit int64) (s *service, operator string, ok bool) {
	if !c.readForm(w, r, limit) {
		return nil, "", false
	}
	if operator, ok = c.operator(r); !ok {
		c.unauthorized(w, r)
		return nil, "", false
	}
	s, err := c.service(r)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err)
		return nil, "", false
	}
	return s, operator, true
}

// unauthorized answers an action without an operator credential.
func (c *Console) unauthorized(w http.ResponseWriter, r *http.Request) {
	err := errors.New("console: actions need an operator: sign in first")
	if c.passwordHash == nil {
		err = errors.New("console: actions need an operator the service authenticates (console.Options.Authorize refused this request)")
	}
	c.fail(w, r, http.StatusUnauthorized, err)
}

// badRequest is an error in the submitted form.
type badRequest struct{ error }

func (c *Console) parkedAction(ctx context.Context, s *service, kind actionKind, r *http.Request, dryRun bool) (int64, error) {
	var f outbox.ParkedFilter
	switch r.PostFormValue("scope") {
	case "all":
		q, err := parseParkedQuery(r)
		if err != nil {
			return 0, badRequest{err}
		}
		var ok bool
		if f, ok = q.adminFilter(); !ok {
			return c.parkedActionByPages(ctx, s, kind, q, dryRun)
		}
	case "ids", "":
		for _, raw := range r.PostForm["id"] {
			id, err := outbox.ParseInboxID(raw)
			if err != nil {
				return 0, badRequest{err}
			}
			f.IDs = append(f.IDs, id)
		}
		if len(f.IDs) == 0 {
			return 0, badRequest{errors.New("no event selected: tick at least one, or choose all matching")}
		}
	default:
		return 0, badRequest{fmt.Errorf("scope must be ids or all, not %q", r.PostFormValue("scope"))}
	}
	if kind == actRedrive {
		return s.admin.RequestRedrive(ctx, f, dryRun)
	}
	return s.admin.PurgeParked(ctx, f, dryRun)
}

// parkedActionByPages acts on every parked event q selects when
// outbox.ParkedFilter cannot express q (a key, a lower time bound, a view):
// a page of ids at a time (eachParkedPage), never all of them in memory or
// in one $in. A re-drive first counts every page as a dry run, so that a
// selection holding a record that can never be re-driven is refused
// (outbox.ErrNotRedrivable) before anything changes, as one request would.
func (c *Console) parkedActionByPages(ctx context.Context, s *service, kind actionKind, q parkedQuery, dryRun bool) (int64, error) {
	pass := func(dry bool) (int64, error) {
		var n int64
		err := eachParkedPage(ctx, s, q, actionPageSize, func(ids []outbox.InboxID) error {
			f := outbox.ParkedFilter{IDs: ids}
			var m int64
			var err error
			if kind == actRedrive {
				m, err = s.admin.RequestRedrive(ctx, f, dry)
			} else {
				m, err = s.admin.PurgeParked(ctx, f, dry)
			}
			if errors.Is(err, outbox.ErrNotParked) {
				err = nil // changed meanwhile: none of the page is parked any more
			}
			n += m
			return err
		})
		return n, err
	}
	if dryRun || kind == actRedrive {
		n, err := pass(true)
		if dryRun || err != nil {
			return n, err
		}
	}
	return pass(false)
}

// actionPageSize is how many ids an "all matching" action sends to MongoDB
// at a time.
const actionPageSize = 500

func (c *Console) failedAction(ctx context.Context, s *service, kind actionKind, r *http.Request, dryRun bool) (int64, error) {
	topic := strings.TrimSpace(r.PostFormValue("topic"))
	var hexIDs []string
	switch r.PostFormValue("scope") {
	case "all":
	case "ids", "":
		hexIDs = r.PostForm["id"]
		if len(hexIDs) == 0 {
			return 0, badRequest{errors.New("no event selected: tick at least one, or choose all")}
		}
		for _, h := range hexIDs {
			if _, err := bson.ObjectIDFromHex(h); err != nil {
				return 0, badRequest{fmt.Errorf("failed event id %q is not a hex ObjectID", h)}
			}
		}
	default:
		return 0, badRequest{fmt.Errorf("scope must be ids or all, not %q", r.PostFormValue("scope"))}
	}
	f := outbox.FailedFilter{Topic: topic}
	if kind == actRetry {
		return s.admin.RetryFailed(ctx, f, hexIDs, dryRun)
	}
	return s.admin.DiscardFailed(ctx, f, hexIDs, dryRun)
}
