// Package console is the operations console of the outbox framework: an
// http.Handler that shows, for one or more services, the outbox backlog,
// the partitions each replica publishes and handles, the parked and held
// events, the failed outbox events, the scheduled events and the doctor's
// findings (the settings of MongoDB and Kafka that break or risk a
// guarantee), and (when enabled) lets an operator re-drive, purge, retry or
// discard events, or cancel a scheduled one.
//
// Pages are rendered on the server with html/template; the stylesheet and
// the small script (auto-refresh only) are embedded in the binary. Nothing
// is fetched from another site, and every page reads without JavaScript.
//
// # Mounting
//
// The handler serves its pages under its own root with relative links, so
// mount it under a prefix with http.StripPrefix:
//
//	ui, err := console.New(console.Options{Services: []console.Service{console.ServiceOf(cfg)}})
//	mux.Handle("/outbox/ui/", http.StripPrefix("/outbox/ui", ui))
//
// # Safety
//
// The console answers only to the hosts it serves (Options.AllowedHosts,
// localhost and IP literals): any other Host header gets 421 before a page
// or a token, which defeats DNS rebinding. It is read-only unless
// Options.EnableActions is set, and actions need an operator credential:
// the console's own sign-in (Options.OperatorPassword) or the service's
// authentication (Options.Authorize); reaching the console, even on
// loopback, is not authentication. Actions are POST requests that must pass
// a same-origin check (Sec-Fetch-Site, then Origin or Referer against the
// served hosts) and carry a CSRF token bound to a cookie of the browser; a
// first POST only shows how many events the action would change (the same
// dry-run count outboxctl prints) and asks for confirmation. No page shows a
// connection string or credential. Pages are readable by whoever reaches
// the console: put it behind the service's authentication when it listens
// beyond loopback (see the README's Operations console section).
//
// # Reads
//
// Each page states the MongoDB queries it runs; all are served by the
// framework's indexes (outbox_pending, outbox_failed, outbox_published_ttl,
// inbox_parked, inbox_handled_ttl, outbox_scheduled_due, the claim check's
// payloads_ref, the _id index) except the find page's,
// which needs the indexes EnsureFindIndexes creates and refuses to run
// without them.
package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Service is one service the console shows: its database, collections and
// Kafka groups.
type Service struct {
	// Name labels the service in pages and links. Required; unique among
	// Options.Services.
	Name string
	// Database holds the service's outbox and inbox collections. Required.
	Database *mongo.Database
	// OutboxCollection is the outbox collection's name. Defaults to
	// "outbox".
	OutboxCollection string
	// InboxCollection is the inbox collection's name. Defaults to "inbox".
	InboxCollection string
	// ConsumerGroup is the service's consumer group (Config.ConsumerGroup).
	// Defaults to Name.
	ConsumerGroup string
	// PublisherGroup is the service's publisher group
	// (Config.PublisherGroup). Defaults to Name + ".outbox-publisher".
	PublisherGroup string
	// TopicPrefix is the service's Config.TopicPrefix: the health page
	// checks the Kafka topics it names. Defaults to "".
	TopicPrefix string
	// ClaimCheckDatabase holds the outbox_payloads collection of the
	// payloads the service's events stored out of band
	// (Config.ClaimCheck.Database): an event page whose payload is out of
	// band reads its stored size and publication mark there (the first
	// chunk, by the index payloads_ref). Defaults to nil: the page shows
	// the reference and the size the event's document records.
	ClaimCheckDatabase *mongo.Database
}

// ServiceOf returns the Service that shows the service cfg configures, with
// Config's defaults applied. cfg.Mongo must be set.
func ServiceOf(cfg outbox.Config) Service {
	s := Service{Name: cfg.Service, OutboxCollection: cfg.OutboxCollection, InboxCollection: cfg.InboxCollection,
		ConsumerGroup: cfg.ConsumerGroup, PublisherGroup: cfg.PublisherGroup, TopicPrefix: cfg.TopicPrefix}
	if cfg.Mongo != nil {
		s.Database = cfg.Mongo.Database(cfg.Database)
	}
	if cfg.ClaimCheck != nil {
		s.ClaimCheckDatabase = cmp.Or(cfg.ClaimCheck.Database, s.Database)
	}
	return s
}

func (s Service) withDefaults() Service {
	s.OutboxCollection = cmp.Or(s.OutboxCollection, "outbox")
	s.InboxCollection = cmp.Or(s.InboxCollection, "inbox")
	s.ConsumerGroup = cmp.Or(s.ConsumerGroup, s.Name)
	s.PublisherGroup = cmp.Or(s.PublisherGroup, s.Name+".outbox-publisher")
	return s
}

// Options configures a Console.
type Options struct {
	// Services are the services shown. Required: at least one.
	Services []Service
	// Kafka reads the consumer and publisher groups for the partitions page.
	// Defaults to nil: the partitions page says that Kafka is not
	// configured.
	Kafka *kadm.Client
	// EnableActions allows re-drive, purge, retry and discard, by an
	// operator that OperatorPassword or Authorize authenticates (at least
	// one is required with it). Defaults to false: the console is read-only
	// and refuses every POST.
	EnableActions bool
	// OperatorPassword turns on the console's sign-in page: an operator
	// signs in with this password (compared in constant time; after five
	// wrong ones in a row, sign-in pauses, from 1 s doubling to a minute)
	// and gets a session cookie (HttpOnly, SameSite=Strict, valid for
	// SessionTTL in this browser only) that lets them run actions. At least
	// 8 characters. Defaults to "": no sign-in page.
	OperatorPassword string
	// Authorize authenticates operators by the service's own means (its
	// session, a header its authenticating proxy sets): a request it
	// accepts may run actions, and the name it returns is logged with each
	// action. Defaults to nil.
	Authorize func(r *http.Request) (operator string, ok bool)
	// SessionTTL is how long a sign-in lasts. Defaults to 8 hours.
	SessionTTL time.Duration
	// AllowedHosts are the host names, besides localhost and IP literals,
	// that the console answers to (ports are ignored): list the names
	// operators open it by, such as a proxy's public name. A request whose
	// Host header names another host is refused with 421 Misdirected
	// Request before any page or token, and an action's Origin must be the
	// request's own or name a listed host. "*" allows any host: only when
	// every request is authenticated before it reaches the console, or a
	// page anywhere can read it by DNS rebinding. Defaults to none.
	AllowedHosts []string
	// SecureCookies marks the console's cookies Secure even on plain HTTP
	// requests: set it behind a proxy that terminates TLS. Defaults to
	// false: Secure when the request itself came over TLS.
	SecureCookies bool
	// CSRFKey signs the CSRF tokens. Replicas behind one load balancer need
	// the same key (at least 32 bytes), or a form rendered by one replica
	// is refused by another. Defaults to a random key per Console.
	CSRFKey []byte
	// Title is shown in every page's header. Defaults to "outbox console".
	Title string
	// PageSize caps the events listed per page. Defaults to 100.
	PageSize int
	// QueryTimeout bounds the reads and writes of one request. Defaults to
	// 10 s.
	QueryTimeout time.Duration
	// Logger receives the errors of failed requests. Defaults to a logger
	// that discards everything.
	Logger *slog.Logger
}

// Console is the operations console's http.Handler. It is safe for
// concurrent use and starts no goroutines.
type Console struct {
	opts     Options
	services []*service
	byName   map[string]*service
	pages    map[string]*template.Template
	mux      *http.ServeMux
	csrfKey  []byte
	// hosts are the AllowedHosts names (lower case); anyHost is "*".
	hosts   map[string]bool
	anyHost bool
	// passwordHash is the SHA-256 of OperatorPassword, nil without one.
	passwordHash []byte
	limiter      signInLimiter
	now          func() time.Time // time.Now; tests move it
}

// service is a Service with its Admin.
type service struct {
	Service
	admin         *outbox.Admin
	outbox, inbox *mongo.Collection
	findIdx       indexCache
}

// ErrOptions wraps every configuration error of New.
var ErrOptions = errors.New("console: invalid options")

// New returns a Console for opts.
func New(opts Options) (*Console, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrOptions, fmt.Sprintf(format, args...))
	}
	if len(opts.Services) == 0 {
		return nil, bad("Services is required")
	}
	opts.Title = cmp.Or(opts.Title, "outbox console")
	opts.PageSize = cmp.Or(opts.PageSize, 100)
	opts.QueryTimeout = cmp.Or(opts.QueryTimeout, 10*time.Second)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.SessionTTL = cmp.Or(opts.SessionTTL, 8*time.Hour)
	if opts.PageSize < 1 {
		return nil, bad("PageSize must be positive")
	}
	if opts.SessionTTL < 0 {
		return nil, bad("SessionTTL must not be negative")
	}
	c := &Console{opts: opts, byName: map[string]*service{}, hosts: map[string]bool{}, now: time.Now}
	switch {
	case opts.EnableActions && opts.OperatorPassword == "" && opts.Authorize == nil:
		return nil, bad("EnableActions needs an operator credential: set OperatorPassword (the console's sign-in) " +
			"or Authorize (the service's authentication); reaching the console is not authentication")
	case opts.OperatorPassword != "" && len(opts.OperatorPassword) < 8:
		return nil, bad("OperatorPassword must have at least 8 characters")
	case opts.OperatorPassword != "":
		h := sha256.Sum256([]byte(opts.OperatorPassword))
		c.passwordHash = h[:]
	}
	for _, h := range opts.AllowedHosts {
		switch name := hostName(strings.TrimSpace(h)); {
		case name == "*":
			c.anyHost = true
		case name == "" || strings.ContainsAny(h, "/?#@ \t"):
			return nil, bad("AllowedHosts has %q: want a host name, such as console.example.com", h)
		default:
			c.hosts[name] = true
		}
	}
	for i, s := range opts.Services {
		if s.Name == "" {
			return nil, bad("Services[%d].Name is required", i)
		}
		if s.Database == nil {
			return nil, bad("Services[%d].Database is required", i)
		}
		if c.byName[s.Name] != nil {
			return nil, bad("Services has %q twice", s.Name)
		}
		s = s.withDefaults()
		svc := &service{Service: s, admin: outbox.NewAdmin(s.Database, s.OutboxCollection, s.InboxCollection),
			outbox: s.Database.Collection(s.OutboxCollection), inbox: s.Database.Collection(s.InboxCollection)}
		c.services = append(c.services, svc)
		c.byName[s.Name] = svc
	}
	switch {
	case opts.CSRFKey == nil:
		c.csrfKey = make([]byte, 32)
		_, _ = rand.Read(c.csrfKey) // never fails (crypto/rand doc)
	case len(opts.CSRFKey) < 32:
		return nil, bad("CSRFKey must have at least 32 bytes")
	default:
		c.csrfKey = opts.CSRFKey
	}
	pages, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	c.pages = pages
	c.mux = c.routes()
	return c, nil
}

// routes are the console's pages, relative to where it is mounted:
//
//	GET  /              overview
//	GET  /parked        parked and held events (filters in the query)
//	GET  /event         one inbox event (?svc=&id=topic/schema/key)
//	GET  /failed        failed outbox events
//	GET  /outbox-event  one outbox event (?svc=&id=hex)
//	GET  /partitions    partitions and their owners, offsets and lag
//	GET  /find          an event's journey (?q=&by=idempotency|partition)
//	GET  /health        the doctor's findings (outbox.Admin.Doctor)
//	GET  /scheduled     scheduled events waiting for their due time
//	GET  /assets/...    stylesheet and script
//	GET  /login, POST /login, POST /logout    sign-in (Options.OperatorPassword)
//	POST /redrive, /purge, /retry, /discard   actions (Options.EnableActions)
//	POST /cancel        cancel a scheduled event (Options.EnableActions)
//
// An inbox event's id is outbox.InboxID.String: topic/schema/key with
// each part escaped, so that a slash in a key or schema never misaddresses
// an event.
func (c *Console) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /parked", c.parked)
	mux.HandleFunc("GET /event", c.inboxEvent)
	mux.HandleFunc("GET /failed", c.failed)
	mux.HandleFunc("GET /outbox-event", c.outboxEvent)
	mux.HandleFunc("GET /partitions", c.partitions)
	mux.HandleFunc("GET /find", c.find)
	mux.HandleFunc("GET /health", c.health)
	mux.HandleFunc("GET /scheduled", c.scheduledList)
	assets, _ := fs.Sub(assetFS, "assets")
	mux.Handle("GET /assets/", http.StripPrefix("/assets", http.FileServerFS(assets)))
	mux.HandleFunc("POST /redrive", c.action(actRedrive))
	mux.HandleFunc("POST /purge", c.action(actPurge))
	mux.HandleFunc("POST /retry", c.action(actRetry))
	mux.HandleFunc("POST /discard", c.action(actDiscard))
	mux.HandleFunc("POST /cancel", c.cancelScheduled)
	if c.passwordHash != nil {
		mux.HandleFunc("GET /login", c.loginForm)
		mux.HandleFunc("POST /login", c.login)
		mux.HandleFunc("POST /logout", c.logout)
	}
	return mux
}

// ServeHTTP serves the console. A request for a host the console does not
// serve is refused first (421). Every response forbids framing and
// caching, and pages may load nothing but their own assets.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if !c.hostAllowed(r.Host) {
		misdirected(w, r)
		return
	}
	if r.URL.Path == "" { // mounted with StripPrefix("/x/ui") and asked for /x/ui
		u, _, _ := strings.Cut(r.RequestURI, "?")
		w.Header().Set("Location", u+"/")
		w.WriteHeader(http.StatusFound)
		return
	}
	if r.Method == http.MethodPost && !c.opts.EnableActions {
		http.Error(w, "the console is read-only: actions are not enabled (console.Options.EnableActions)", http.StatusForbidden)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// service returns the service named in the request's svc parameter, or the
// first one when it names none.
func (c *Console) service(r *http.Request) (*service, error) {
	name := r.FormValue("svc")
	if name == "" {
		return c.services[0], nil
	}
	s := c.byName[name]
	if s == nil {
		return nil, fmt.Errorf("no service named %q", name)
	}
	return s, nil
}

func (c *Console) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), c.opts.QueryTimeout)
}

// page is what every template gets.
type page struct {
	Title, Page string
	// ListPage is the page the service switcher links to: the listing
	// of the page's kind (parked, failed), never a detail.
	ListPage string
	Services []*service
	Service  *service
	// Actions: this request may run actions (enabled, and an operator
	// authenticated). SignIn: actions are enabled and the sign-in page
	// would allow them. SignedIn: a sign-in session is open (sign out).
	Actions, SignIn, SignedIn bool
	CSRF                      string
	Error                     string
	Data                      any
	RenderedAt                time.Time
	RenderSeconds             string
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, name string, svc *service, data any, start time.Time) {
	c.renderStatus(w, r, http.StatusOK, name, svc, data, start)
}

// renderStatus renders a page with the given status.
func (c *Console) renderStatus(w http.ResponseWriter, r *http.Request, code int, name string, svc *service, data any, start time.Time) {
	p := page{Title: c.opts.Title, Page: name, ListPage: "parked", Services: c.services, Service: svc,
		Data: data, RenderedAt: time.Now().UTC()}
	switch name {
	case "failed", "outbox-event":
		p.ListPage = "failed"
	case "scheduled":
		p.ListPage = "scheduled"
	}
	c.setMode(w, r, &p)
	p.RenderSeconds = fmt.Sprintf("%.3f", time.Since(start).Seconds())
	var b strings.Builder
	if err := c.pages[name].ExecuteTemplate(&b, "layout", p); err != nil {
		c.opts.Logger.Error("console: render page", "page", name, "err", err)
		http.Error(w, "console: render page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(b.String()))
}

// fail renders the error page. The error text goes through redact: a
// driver error may quote a connection string.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, code int, err error) {
	c.opts.Logger.Warn("console: request failed", "path", r.URL.Path, "err", err)
	p := page{Title: c.opts.Title, Page: "error", Services: c.services,
		Error: redact(err.Error()), RenderedAt: time.Now().UTC()}
	c.setMode(w, r, &p)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_ = c.pages["error"].ExecuteTemplate(w, "layout", p)
}

// setMode sets what the header of p says about actions, the same on every
// page, error pages included (they said "actions enabled" to a visitor who
// had not signed in): actions for a signed-in operator, else read-only,
// with a sign-in link when actions need one.
func (c *Console) setMode(w http.ResponseWriter, r *http.Request, p *page) {
	if !c.opts.EnableActions {
		return
	}
	p.CSRF = c.csrfToken(w, r)
	_, p.Actions = c.operator(r)
	p.SignedIn = c.passwordHash != nil && c.validSession(r)
	p.SignIn = !p.Actions && c.passwordHash != nil
}
