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

// errKafkaDown is what a Kafka dial returns while the replica's Kafka is
// unreachable in refuse mode.
var errKafkaDown = errors.New("chaos: kafka unreachable")

// netSwitch is one replica's network: every MongoDB and Kafka connection of
// the replica is dialled through it. Cut closes every open connection at
// once and refuses new ones, which is what the servers see when a process
// dies (the kernel closes its sockets): requests in flight get no reply,
// open transactions stay open on the server until they expire, the Kafka
// group member stays in the group until its session times out.
//
// Kafka alone can also be made unreachable until a given time (fault
// "kafka-down-start"): in refuse mode its dials fail at once, in black-hole
// mode they hang until the outage ends or the dial's context ends (as a
// dropped SYN does).
type netSwitch struct {
	mu    sync.Mutex
	cut   bool
	conns map[*switchedConn]struct{}

	kafkaDownUntil time.Time
	blackHole      bool
	outageOver     chan struct{} // closed when the Kafka outage ends
}

// kafkaDown makes Kafka unreachable for d.
func (s *netSwitch) kafkaDown(d time.Duration, blackHole bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kafkaDownUntil = time.Now().Add(d)
	s.blackHole = blackHole
	over := make(chan struct{})
	s.outageOver = over
	time.AfterFunc(d, func() { close(over) })
}

// kafkaIsDown reports whether Kafka is unreachable now (or was until
// less than grace ago).
func (s *netSwitch) kafkaIsDown(grace time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Before(s.kafkaDownUntil.Add(grace))
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
	s.mu.Lock()
	down, hole, over := time.Now().Before(s.kafkaDownUntil), s.blackHole, s.outageOver
	s.mu.Unlock()
	if down && !hole {
		return nil, errKafkaDown
	}
	if down {
		select {
		case <-over:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
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
