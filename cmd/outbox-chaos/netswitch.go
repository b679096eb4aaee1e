package main

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// errKilled is what every dial of a killed replica returns.
var errKilled = errors.New("chaos: replica killed (network cut)")

// netSwitch is one replica's network: every MongoDB and Kafka connection of
// the replica is dialled through it. Cut closes every open connection at
// once and refuses new ones, which is what the servers see when a process
// dies (the kernel closes its sockets): requests in flight get no reply,
// open transactions stay open on the server until they expire, the Kafka
// group member stays in the group until its session times out.
type netSwitch struct {
	mu    sync.Mutex
	cut   bool
	conns map[*switchedConn]struct{}
}

func newNetSwitch() *netSwitch {
	return &netSwitch{conns: map[*switchedConn]struct{}{}}
}

// DialContext implements the MongoDB driver's ContextDialer and, through
// dialKafka, kgo's dialer. kgo does not apply a timeout to a custom dialer,
// so one is enforced here.
func (s *netSwitch) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if s.isCut() {
		return nil, errKilled
	}
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: -1}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	sc := &switchedConn{Conn: c, sw: s}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut {
		_ = c.Close()
		return nil, errKilled
	}
	s.conns[sc] = struct{}{}
	return sc, nil
}

func (s *netSwitch) dialKafka(ctx context.Context, network, host string) (net.Conn, error) {
	return s.DialContext(ctx, network, host)
}

func (s *netSwitch) isCut() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cut
}

// Cut closes every connection and refuses new ones, for good.
func (s *netSwitch) Cut() {
	s.mu.Lock()
	s.cut = true
	conns := s.conns
	s.conns = map[*switchedConn]struct{}{}
	s.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
}

type switchedConn struct {
	net.Conn
	sw *netSwitch
}

func (c *switchedConn) Close() error {
	c.sw.mu.Lock()
	delete(c.sw.conns, c)
	c.sw.mu.Unlock()
	return c.Conn.Close()
}
