package ipc_test

import (
	"testing"

	"github.com/keel-runtime/keel/ipc"
)

func TestCheckAddr(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr  string
		allow bool
		ok    bool
	}{
		{"127.0.0.1:7433", false, true},
		{"[::1]:0", false, true},
		{"localhost:7433", false, true},
		{"0.0.0.0:7433", false, false},
		{"192.168.1.2:7433", false, false},
		{"0.0.0.0:7433", true, true},
		{"127.0.0.1", true, false}, // no port
	}
	for _, tt := range tests {
		if err := ipc.CheckAddr(tt.addr, tt.allow); (err == nil) != tt.ok {
			t.Errorf("CheckAddr(%q, %v) = %v, want ok %v", tt.addr, tt.allow, err, tt.ok)
		}
	}
}
