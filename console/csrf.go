package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
)

// CSRF protection of the actions.
//
// Two checks, both required:
//
//  1. Same origin. A browser tells where a request comes from: Sec-Fetch-Site
//     (modern browsers) must be "same-origin" or "none"; then Origin, when
//     present, must be the request's own origin or name a host listed in
//     Options.AllowedHosts (never merely the Host header: under DNS
//     rebinding the attacker's page and its Host header share a name, which
//     ServeHTTP refuses before this); otherwise Referer, when present, must.
//     A request with none of the three (curl, scripts) is judged by the
//     token alone.
//  2. A token. Each browser gets a random cookie (HttpOnly, SameSite=Strict)
//     the first time it loads a page; forms carry HMAC-SHA256(key, cookie)
//     in a hidden field. Another site can neither read the token (the same
//     origin policy hides our pages from its scripts) nor set the cookie.
//
// The key is Options.CSRFKey, random per Console by default.

const (
	csrfCookie = "outbox_console_csrf"
	csrfField  = "csrf"
)

// errCSRF is the refusal of a request that fails a check.
var errCSRF = errors.New("console: request refused by the CSRF protection")

// csrfToken returns the token for the request's browser, setting its cookie
// first when it has none.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || len(ck.Value) != 64 {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		ck = &http.Cookie{Name: csrfCookie, Value: hex.EncodeToString(b), HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: c.secure(r)}
		http.SetCookie(w, ck)
	}
	return c.sign(ck.Value)
}

func (c *Console) sign(cookie string) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte("outbox-console-csrf\x00" + cookie))
	return hex.EncodeToString(m.Sum(nil))
}

// readForm reads a POSTed form of at most limit bytes and checks it
// against CSRF; it answers the request and returns false when either
// fails.
func (c *Console) readForm(w http.ResponseWriter, r *http.Request, limit int64) bool {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, fmt.Errorf("read form: %w", err))
		return false
	}
	if err := c.checkCSRF(r); err != nil {
		c.fail(w, r, http.StatusForbidden, err)
		return false
	}
	return true
}

// checkCSRF reports why r fails the CSRF checks, or nil.
func (c *Console) checkCSRF(r *http.Request) error {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin", "none":
	default:
		return errors.Join(errCSRF, errors.New("cross-site request (Sec-Fetch-Site: "+safeHeader(site)+")"))
	}
	if o := r.Header.Get("Origin"); o != "" {
		if !c.originAllowed(o, r) {
			return errors.Join(errCSRF, errors.New("origin "+safeHeader(o)+" is not this console's"))
		}
	} else if ref := r.Header.Get("Referer"); ref != "" && !c.originAllowed(ref, r) {
		return errors.Join(errCSRF, errors.New("referer is not this console's"))
	}
	ck, err := r.Cookie(csrfCookie)
	if err != nil {
		return errors.Join(errCSRF, errors.New("no CSRF cookie: load a page of the console first"))
	}
	got := r.PostFormValue(csrfField)
	if got == "" || !hmac.Equal([]byte(got), []byte(c.sign(ck.Value))) {
		return errors.Join(errCSRF, errors.New("missing or wrong CSRF token: reload the page and try again"))
	}
	return nil
}

var unsafeHeaderChars = regexp.MustCompile(`[^A-Za-z0-9.:/_-]`)

// safeHeader trims a header value for an error message.
func safeHeader(s string) string {
	if len(s) > 100 {
		s = s[:100]
	}
	return unsafeHeaderChars.ReplaceAllString(s, "?")
}

// userinfoPassword matches the password of a URL's userinfo.
var userinfoPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*):([^@/?#\s]*)@`)

// redact hides URL passwords in a message (a driver error may quote a
// connection string).
func redact(s string) string { return userinfoPassword.ReplaceAllString(s, "$1:xxxxx@") }
