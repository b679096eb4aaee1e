package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Who may reach the console, and who may act.
//
// Hosts. A browser sends the name it resolved in the Host header. A page on
// attacker.example whose DNS the attacker switches to 127.0.0.1 (DNS
// rebinding) reaches a console on loopback as attacker.example: same origin
// as the attacker's page, whose script could read every page and its CSRF
// token. So the console serves only the hosts it is told to serve
// (Options.AllowedHosts), localhost and IP literals, and answers any other
// Host with 421 before it renders a page or sets a cookie; an action's
// Origin (or Referer) must name the request's own host or an allowed name.
//
// Operators. Being able to reach the console is not authentication (every
// local process and, through a rebinding page, every website can reach
// 127.0.0.1). Actions need an operator: either the console's own sign-in
// (Options.OperatorPassword: a form that sets a session cookie) or the
// service's authentication (Options.Authorize).

const sessionCookie = "outbox_console_session"

// hostName is the host of a Host header or URL host, without port or
// brackets, lower case, without a trailing dot.
func hostName(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), ".")
	return strings.ToLower(h)
}

// isLocalName reports whether a host name needs no listing: localhost, or
// an IP literal (a browser that sends one connected to that address, so no
// DNS answer chose it).
func isLocalName(h string) bool {
	return h == "localhost" || net.ParseIP(h) != nil
}

// hostAllowed reports whether the console serves requests whose Host
// header is hostport.
func (c *Console) hostAllowed(hostport string) bool {
	h := hostName(hostport)
	return h != "" && (isLocalName(h) || c.anyHost || c.hosts[h])
}

// originAllowed reports whether an action may come from the page at raw
// (an Origin or Referer): one of the request's own origin (its Host, which
// hostAllowed accepted), or a name listed in AllowedHosts (the public name
// of a proxy that rewrites Host). Never merely any listed IP or localhost:
// another port of localhost is another origin.
func (c *Console) originAllowed(raw string, r *http.Request) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	h := hostName(u.Host)
	return !isLocalName(h) && c.hosts[h]
}

// misdirected answers a request for a host the console does not serve.
func misdirected(w http.ResponseWriter, r *http.Request) {
	http.Error(w, fmt.Sprintf("console: host %q is not served here (DNS rebinding defence): open the console by an allowed name, "+
		"localhost or its IP address, or add the name to console.Options.AllowedHosts (outboxctl ui -allowed-hosts)",
		safeHeader(r.Host)), http.StatusMisdirectedRequest)
}

// operator returns who may run actions with r, if anyone: the service's
// Authorize, or a valid session of the console's sign-in.
func (c *Console) operator(r *http.Request) (string, bool) {
	if !c.opts.EnableActions {
		return "", false
	}
	if c.opts.Authorize != nil {
		if name, ok := c.opts.Authorize(r); ok {
			return name, true
		}
	}
	if c.passwordHash != nil && c.validSession(r) {
		return "signed-in operator", true
	}
	return "", false
}

// A session cookie holds its expiry and an HMAC, under the CSRF key, of
// the expiry, the browser's CSRF cookie and the password's hash: it is
// worthless in another browser, after it expires, and once the password
// changes.
func (c *Console) sessionMAC(expiry, csrf string) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte("outbox-console-session\x00" + expiry + "\x00" + csrf + "\x00"))
	m.Write(c.passwordHash)
	return hex.EncodeToString(m.Sum(nil))
}

func (c *Console) validSession(r *http.Request) bool {
	s, err := r.Cookie(sessionCookie)
	if err != nil {
		return false
	}
	ck, err := r.Cookie(csrfCookie)
	if err != nil {
		return false
	}
	expiry, mac, ok := strings.Cut(s.Value, ".")
	if !ok {
		return false
	}
	until, err := strconv.ParseInt(expiry, 10, 64)
	if err != nil || c.now().Unix() >= until {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(c.sessionMAC(expiry, ck.Value)))
}

// loginPage is the sign-in page's data.
type loginPage struct {
	Failed bool
}

// loginForm shows the sign-in form.
func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, "login", nil, loginPage{}, time.Now())
}

// login checks the operator password (a constant-time comparison of
// SHA-256 hashes) and sets the session cookie. After five failures in a
// row, sign-in pauses (1 s, doubling up to a minute) before it compares
// again.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !c.readForm(w, r, 64<<10) {
		return
	}
	if wait := c.limiter.wait(c.now()); wait > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds()+1)))
		c.fail(w, r, http.StatusTooManyRequests, fmt.Errorf("too many wrong passwords: sign-in pauses for %s", wait.Round(time.Second)))
		return
	}
	given := sha256.Sum256([]byte(r.PostFormValue("password")))
	if subtle.ConstantTimeCompare(given[:], c.passwordHash) != 1 {
		c.limiter.failed(c.now())
		c.opts.Logger.Warn("console: sign-in refused: wrong operator password", "remote", r.RemoteAddr)
		c.renderStatus(w, r, http.StatusUnauthorized, "login", nil, loginPage{Failed: true}, time.Now())
		return
	}
	c.limiter.succeeded()
	ck, err := r.Cookie(csrfCookie)
	if err != nil { // checkCSRF required it
		c.fail(w, r, http.StatusForbidden, errCSRF)
		return
	}
	expiry := strconv.FormatInt(c.now().Add(c.opts.SessionTTL).Unix(), 10)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: expiry + "." + c.sessionMAC(expiry, ck.Value),
		MaxAge: int(c.opts.SessionTTL.Seconds()), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.secure(r)})
	c.opts.Logger.Info("console: operator signed in", "remote", r.RemoteAddr)
	seeOverview(w)
}

// logout ends the session.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if !c.readForm(w, r, 64<<10) {
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: c.secure(r)})
	seeOverview(w)
}

// secure reports whether cookies set in answer to r carry Secure.
func (c *Console) secure(r *http.Request) bool { return c.opts.SecureCookies || r.TLS != nil }

// signInLimiter slows password guessing down: after five failures in a row,
// it makes sign-in wait 1 s, then 2 s, 4 s... up to a minute, until a
// success.
type signInLimiter struct {
	mu       sync.Mutex
	failures int
	until    time.Time
}

const freeSignInFailures = 5

func (l *signInLimiter) wait(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(l.until.Sub(now), 0)
}

func (l *signInLimiter) failed(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures++
	if n := l.failures - freeSignInFailures; n > 0 {
		l.until = now.Add(min(time.Second<<min(n-1, 6), time.Minute))
	}
}

func (l *signInLimiter) succeeded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures, l.until = 0, time.Time{}
}

// seeOverview redirects to the overview, relative to the console's root
// (http.Redirect would resolve "./" against the path StripPrefix left).
func seeOverview(w http.ResponseWriter) {
	w.Header().Set("Location", "./")
	w.WriteHeader(http.StatusSeeOther)
}
