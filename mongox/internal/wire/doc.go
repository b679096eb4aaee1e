// Package wire frames MongoDB wire protocol messages: it reads OP_MSG and
// legacy OP_QUERY requests off a stream and writes OP_MSG and OP_REPLY
// responses. It knows nothing of commands or data; the server shell decodes
// the command body it returns.
//
// # Reading
//
// ReadMessage reads exactly one message; a Reader does the same reusing one
// buffer, its messages valid until the next read. Every document it returns has been
// validated as BSON, so later decoding fails only on semantic grounds, and
// nests at most bsonkit.MaxWireDepth levels of documents and arrays,
// measured on the raw bytes without recursion, so recursive decoders cannot
// exhaust the stack. An error wrapping ErrMalformed, ErrCompressed,
// ErrUnsupportedOpCode or ErrTooDeep (a *DepthError) means the message was
// consumed in full and the stream is still in step, so the caller may reply
// and carry on; any other error (including a length beyond
// the size limit) leaves the stream out of step and the connection should be
// closed.
//
// # Writing
//
// WriteMsg and WriteReply build a whole frame in one buffer and hand it to
// the writer in one Write call. They never set the checksum flag.
package wire
