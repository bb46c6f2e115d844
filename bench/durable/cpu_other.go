//go:build !unix

package main

import "time"

// cpuTime is the CPU time the process has used so far: not read on this
// system, always 0.
func cpuTime() time.Duration { return 0 }

// sysTime is the part of cpuTime spent in the kernel: not read on this
// system, always 0.
func sysTime() time.Duration { return 0 }
