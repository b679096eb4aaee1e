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
// guards the service's other operator endpoints).
func ExampleNew() {
	var cfg outbox.Config // the service's framework configuration
	var adm *kadm.Client  // optional: kadm.NewClient(kgoClient) for the partitions page
	ui, err := console.New(console.Options{
		Services:      []console.Service{console.ServiceOf(cfg)},
		Kafka:         adm,
		EnableActions: true, // re-drive, purge, retry, discard; read-only without it
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/ui/", requireOperator(http.StripPrefix("/outbox/ui", ui)))
}

// requireOperator lets only requests with the operator's credentials
// through.
func requireOperator(next http.Handler) http.Handler {
	user, pass := []byte(os.Getenv("CONSOLE_USER")), []byte(os.Getenv("CONSOLE_PASSWORD"))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || len(pass) == 0 ||
			subtle.ConstantTimeCompare([]byte(u), user)&subtle.ConstantTimeCompare([]byte(p), pass) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="outbox console"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
