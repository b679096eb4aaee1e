package outbox

// handlerKey identifies a handler: one per (topic, content schema).
type handlerKey struct {
	topic, schema string
}

// handler is a registered handler, type-erased.
type handler struct {
	key handlerKey
}
