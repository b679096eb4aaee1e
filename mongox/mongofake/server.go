package mongofake

import (
	"log/slog"

	"github.com/event-outbox/outbox/internal/mongo/engine"
)

// Server is an in-process MongoDB-compatible server.
//
// STUB: the "shell" helper owns this file and replaces it.
type Server struct {
	engine *engine.Engine
	data   *dataState // data command families' state; see state.go
	logger *slog.Logger
}

// conn is one client connection. STUB: the "shell" helper owns it.
type conn struct {
	id      int64
	appName string
}
