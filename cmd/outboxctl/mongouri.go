package main

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The connection string holds the password: outboxctl never prints it,
// whole or in part. A mistake in it is described, not quoted: the driver's
// message about the options or hosts, found by checking the string without
// its user information (so no message can carry the password), or, when
// only the user information is wrong, a message that says so without it. A
// string with several "@" is refused: the driver might read part of the
// password as a host name and print it in a connection error.
// On top of that every message outboxctl prints goes through redact, which
// removes the password in its raw, decoded and escaped forms.

// splitUserinfo splits a connection string at its user information: all
// before the last "@" after the scheme (a password may hold an unescaped
// "@", ":", "/" or a space; hosts and options do not hold "@"). rest is the
// string without it.
func splitUserinfo(uri string) (userinfo, rest string) {
	scheme, after, ok := strings.Cut(uri, "://")
	if !ok {
		return "", uri
	}
	i := strings.LastIndex(after, "@")
	if i < 0 {
		return "", uri
	}
	return after[:i], scheme + "://" + after[i+1:]
}

// uriHosts names the hosts of a connection string, for messages.
func uriHosts(uri string) string {
	_, rest := splitUserinfo(uri)
	_, hosts, ok := strings.Cut(rest, "://")
	if !ok {
		return "?"
	}
	if i := strings.IndexAny(hosts, "/?"); i >= 0 {
		hosts = hosts[:i]
	}
	return hosts
}

// uriSecrets returns what must never be printed of a connection string:
// its user information and password, raw, decoded and re-escaped, longest
// first. Parts shorter than 3 bytes are left out (they would blank every
// such letter of a message and protect nothing).
func uriSecrets(uri string) []string {
	userinfo, _ := splitUserinfo(uri)
	if userinfo == "" {
		return nil
	}
	set := map[string]bool{userinfo: true}
	if _, pw, ok := strings.Cut(userinfo, ":"); ok {
		set[pw] = true
		for _, unescape := range []func(string) (string, error){url.PathUnescape, url.QueryUnescape} {
			if p, err := unescape(pw); err == nil {
				set[p] = true
				set[url.QueryEscape(p)] = true
				set[url.PathEscape(p)] = true
			}
		}
	}
	var out []string
	for s := range set {
		if len(s) >= 3 {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// uriPassword matches the password of a URL's userinfo, for URLs other
// than the connection string that a message may quote.
var uriPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*):([^@/?#\s]*)@`)

// redact removes the given secrets from a message, then any URL password.
func redact(msg string, secrets []string) string {
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return uriPassword.ReplaceAllString(msg, "$1:xxxxx@")
}

// clientOptions returns the driver options of the connection string with
// outboxctl's defaults, or a usage error that describes a mistake without
// quoting the string.
func (o *cliOptions) clientOptions(appName string, selection time.Duration) (*options.ClientOptions, error) {
	copts := options.Client().ApplyURI(o.uri)
	if copts.AppName == nil {
		copts.SetAppName(appName)
	}
	if copts.ServerSelectionTimeout == nil {
		copts.SetServerSelectionTimeout(selection)
	}
	if strings.Count(o.uri, "@") > 1 {
		// Which "@" ends the user information is anyone's guess: the
		// driver may take part of the password for a host, and print it.
		return nil, usagef("invalid MongoDB URI (-uri or $MONGODB_URI; not shown, it may hold a password): it has several \"@\": " +
			"percent-encode \"@\" in the user name, password and options as %%40")
	}
	if err := copts.Validate(); err != nil {
		_, rest := splitUserinfo(o.uri)
		if rerr := options.Client().ApplyURI(rest).Validate(); rerr != nil {
			return nil, usagef("invalid MongoDB URI (-uri or $MONGODB_URI; not shown, it may hold a password): %v", rerr)
		}
		return nil, usagef("invalid MongoDB URI (-uri or $MONGODB_URI; not shown): its user name or password is malformed: " +
			"percent-encode the characters @ : / ? # [ ] %% and spaces in them (%%40 for @)")
	}
	return copts, nil
}

// connect opens a client of the connection string; its error names the
// hosts, never the string.
func (o *cliOptions) connect(appName string, selection time.Duration) (*mongo.Client, error) {
	copts, err := o.clientOptions(appName, selection)
	if err != nil {
		return nil, err
	}
	client, err := mongo.Connect(copts)
	if err != nil {
		return nil, fmt.Errorf("connect to MongoDB at %s: %w", uriHosts(o.uri), err)
	}
	return client, nil
}

// disconnect closes a client within 5 s, whatever ctx.
func disconnect(ctx context.Context, client *mongo.Client) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = client.Disconnect(dctx)
}
