//go:build !race

package main

// raceEnabled reports a -race build (see TestChaosShort).
const raceEnabled = false
