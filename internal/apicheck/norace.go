//go:build !race

package apicheck

// raceEnabled is true when this binary is built with -race.
const raceEnabled = false
