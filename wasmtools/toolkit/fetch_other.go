//go:build !wasip1

package toolkit

// hostHTTP is only available inside keel (GOOS=wasip1); a native build of
// a tool, as in its unit tests, uses FetchFunc to substitute a fake.
func hostHTTP(req []byte) ([]byte, error) {
	if FetchFunc != nil {
		return FetchFunc(req)
	}
	return nil, Errorf("network_error", "no network host outside keel")
}

// FetchFunc, in native builds only, answers Fetch's raw JSON requests,
// so a tool's logic can be tested without keel.
var FetchFunc func(req []byte) ([]byte, error)
