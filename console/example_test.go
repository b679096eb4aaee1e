package console_test

import (
	"crypto/subtle"
	"log"
	"net/http"
	"os"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/console"
)

// Mount the console next to the service's API, behind the service's own
// authentication (here HTTP basic auth from the environment; use whatever
// guards the service's other operator endpoints), which also tells the
// console who may run actions.
func ExampleNew() {
	var cfg outbox.Config // the service's framework configuration
	var adm *kadm.Client  // optional: kadm.NewClient(kgoClient) for the partitions page
	ui, err := console.New(console.Options{
		Services:      []console.Service{console.ServiceOf(cfg)},
		Kafka:         adm,
		AllowedHosts:  []string{"ops.example.com"}, // the name operators open it by
		EnableActions: true,                        // re-drive, purge, retry, discard; read-only without it
		Authorize:     operator,                    // who may act
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/ui/", requireOperator(http.StripPrefix("/outbox/ui", ui)))
}

// operator returns the operator requireOperator let through.
func operator(r *http.Request) (string, bool) {
	user, _, ok := r.BasicAuth()
	return user, ok && checkOperator(r)
}

// requireOperator lets only requests with the operator's credentials
// through.
func requireOperator(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !checkOperator(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="outbox console"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// checkOperator compares the request's basic auth credentials with the
// environment's, in constant time.
func checkOperator(r *http.Request) bool {
	user, pass := []byte(os.Getenv("CONSOLE_USER")), []byte(os.Getenv("CONSOLE_PASSWORD"))
	u, p, ok := r.BasicAuth()
	return ok && len(pass) > 0 &&
		subtle.ConstantTimeCompare([]byte(u), user)&subtle.ConstantTimeCompare([]byte(p), pass) == 1
}
