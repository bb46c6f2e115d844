package policy

import "unsafe"

// bytesString views b as a string without copying. The caller must not
// modify b while the string is in use; pointer.lookup's results are
// compared and dropped within a decision, while the arguments are held
// unchanged by the caller.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
