//go:build !unix

package apachekafka

import (
	"context"
	"errors"
	"syscall"
)

var errUnsupported = errors.New("apachekafka: real brokers are supported on Unix systems only")

func lockDir(context.Context, string) (func(), error) { return nil, errUnsupported }

func signalGroup(int, syscall.Signal) error { return errUnsupported }

func sysProcAttr() *syscall.SysProcAttr { return nil }

const (
	sigKill = syscall.Signal(9)
	sigStop = syscall.Signal(19)
	sigCont = syscall.Signal(18)
)
