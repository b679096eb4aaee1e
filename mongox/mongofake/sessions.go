package mongofake

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

func init() {
	register(
		commandSpec{names: []string{"endSessions"}, handler: cmdEndSessions, noSession: true},
		commandSpec{names: []string{"killSessions"}, handler: cmdKillSessions, noSession: true},
		commandSpec{names: []string{"refreshSessions"}, handler: cmdRefreshSessions, noSession: true},
		commandSpec{names: []string{"killAllSessions"}, handler: cmdKillAllSessions, noSession: true},
		commandSpec{names: []string{"killAllSessionsByPattern"}, handler: cmdKillAllSessions, noSession: true},
		commandSpec{names: []string{"startSession"}, handler: cmdStartSession, noSession: true},
	)
}

// sessionList returns the lsid documents of endSessions-like commands.
func sessionList(r *request) ([]bson.D, error) {
	v := r.cmd[0].Value
	arr, ok := v.(bson.A)
	if !ok {
		return nil, wrongType(r.name, v, "array")
	}
	out := make([]bson.D, 0, len(arr))
	for _, x := range arr {
		d, ok := x.(bson.D)
		if !ok {
			return nil, wrongType(r.name, x, "object")
		}
		out = append(out, d)
	}
	return out, nil
}

// cmdEndSessions ends sessions: their open transactions abort and their
// cursors close.
func cmdEndSessions(r *request) (bson.D, error) {
	ids, err := sessionList(r)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		r.srv.data.endSession(id)
	}
	return bson.D{}, nil
}

func cmdRefreshSessions(r *request) (bson.D, error) {
	if _, err := sessionList(r); err != nil {
		return nil, err
	}
	return bson.D{}, nil
}

// cmdKillSessions kills sessions as mongod does
// (https://www.mongodb.com/docs/v7.0/reference/command/killSessions/): the
// commands they run are interrupted, their transactions aborted, their
// cursors closed. An empty list kills every session. It does not wait for
// the interrupted commands, which fail with 11601 Interrupted.
func cmdKillSessions(r *request) (bson.D, error) {
	ids, err := sessionList(r)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return cmdKillAllSessions(r)
	}
	for _, id := range ids {
		r.srv.data.killSession(id)
	}
	return bson.D{}, nil
}

// cmdKillAllSessions kills every session (the patterns of
// killAllSessionsByPattern are users this server does not have).
func cmdKillAllSessions(r *request) (bson.D, error) {
	d := r.srv.data
	d.mu.Lock()
	var all []bson.D
	for _, s := range d.sessions {
		all = append(all, s.lsid)
	}
	d.mu.Unlock()
	for _, l := range all {
		d.killSession(l)
	}
	return bson.D{}, nil
}

func cmdStartSession(r *request) (bson.D, error) {
	u := bson.NewObjectID()
	id := bson.Binary{Subtype: 4, Data: append(u[:], 0, 0, 0, 0)}
	return bson.D{
		{Key: "id", Value: bson.D{{Key: "id", Value: id}}},
		{Key: "timeoutMinutes", Value: int32(30)},
	}, nil
}

var _ = bsonkit.Key
