package mcpserver

// OnStreamWait makes fn be called with the session's ID whenever an
// elicitation starts waiting for its notification stream, until restore.
func OnStreamWait(fn func(session string)) (restore func()) {
	testHookStreamWait.Store(&fn)
	return func() { testHookStreamWait.Store(nil) }
}
