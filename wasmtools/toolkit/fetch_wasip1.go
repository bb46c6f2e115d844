//go:build wasip1

package toolkit

import "unsafe"

//go:wasmimport keel http_request
func httpRequest(ptr unsafe.Pointer, n uint32) uint32

//go:wasmimport keel http_response
func httpResponse(ptr unsafe.Pointer, capacity uint32) uint32

func hostHTTP(req []byte) ([]byte, error) {
	if len(req) == 0 {
		return nil, Errorf("invalid_request", "empty request")
	}
	n := httpRequest(unsafe.Pointer(&req[0]), uint32(len(req)))
	if n == 0 {
		return nil, Errorf("network_error", "the host returned no response")
	}
	buf := make([]byte, n)
	got := httpResponse(unsafe.Pointer(&buf[0]), n)
	return buf[:got], nil
}
