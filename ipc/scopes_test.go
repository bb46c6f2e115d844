package ipc

import "testing"

// TestEveryMethodHasAScope: every method of the table says which scope
// it needs (a missing one would need admin).
func TestEveryMethodHasAScope(t *testing.T) {
	for name := range methods {
		if _, ok := methodScopes[name]; !ok {
			t.Errorf("method %s has no scope in methodScopes", name)
		}
	}
	for name := range methodScopes {
		if _, ok := methods[name]; !ok {
			t.Errorf("methodScopes names %s, which is not a method", name)
		}
	}
}
