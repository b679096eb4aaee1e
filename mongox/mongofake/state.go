package mongofake

// dataState is the state of the data command families: sessions and their
// transactions, retryable-write records, open cursors.
//
// STUB: the "engine" helper owns this file and fills it in.
type dataState struct {
	srv *Server
}

// newDataState is called by NewServer once the engine exists.
func newDataState(srv *Server) *dataState { return &dataState{srv: srv} }

// close is called by Server.Close before the engine closes: it aborts open
// transactions, closes cursors and stops the state's goroutines.
func (d *dataState) close() {}
