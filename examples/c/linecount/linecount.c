// linecount is a keel tool written in C: it counts the lines and bytes of
// a file in the directory granted at /workspace. It is a reactor: keel
// runs _initialize once per instance, then calls keel_call many times on
// the same instance. docs/tools.md explains the ABI; build it with
//
//	clang --target=wasm32-wasi -mexec-model=reactor -O2 -s -o linecount.wasm linecount.c
//
// (Debian 12: apt-get install clang lld wasi-libc libclang-rt-dev-wasm32).
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT(name) __attribute__((export_name(name)))

// The manifest keel reads from keel_manifest. The input schema admits
// only plain relative paths, so the code below never meets a JSON
// escape in a valid path: the host validates every input against it
// before the tool runs.
static const char manifest[] =
    "{\"name\":\"linecount\",\"version\":\"0.1.0\","
    "\"description\":\"Count the lines and bytes of a file in the workspace.\","
    "\"input_schema\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\","
    "\"description\":\"a path relative to the workspace\","
    "\"pattern\":\"^[A-Za-z0-9_.-][A-Za-z0-9_./-]{0,199}$\"}},"
    "\"required\":[\"path\"],\"additionalProperties\":false},"
    "\"output_schema\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},"
    "\"lines\":{\"type\":\"integer\"},\"bytes\":{\"type\":\"integer\"}},"
    "\"required\":[\"path\",\"lines\",\"bytes\"],\"additionalProperties\":false},"
    "\"side_effects\":\"read_only\","
    "\"requests\":{\"fs\":[{\"guest_path\":\"/workspace\",\"read_only\":true}]}}";

// pack returns what keel expects from keel_manifest and keel_call: the
// address of the bytes in the high 32 bits, their length in the low 32.
static uint64_t pack(const char *p, size_t n) {
	return (uint64_t)(uintptr_t)p << 32 | (uint32_t)n;
}

EXPORT("keel_manifest")
uint64_t keel_manifest(void) { return pack(manifest, sizeof manifest - 1); }

// in is the input buffer keel_alloc handed out last; keel writes the
// input there and then calls keel_call. It stays valid until the next
// keel_alloc, which may reuse or replace it. It has a byte more than
// asked for, for a NUL after the input.
static char *in;
static uint32_t in_cap;

EXPORT("keel_alloc")
uint32_t keel_alloc(uint32_t size) {
	if (size >= in_cap) {
		free(in);
		in = malloc((size_t)size + 1);
		in_cap = in ? size + 1 : 0;
	}
	return (uint32_t)(uintptr_t)in; // 0 if out of memory: keel fails the call
}

// result holds the last result object; keel copies it out before the
// next call.
static char result[512];

static uint64_t fail(const char *code, const char *what, const char *why) {
	int n = snprintf(result, sizeof result,
	                 "{\"error\":{\"code\":\"%s\",\"message\":\"%s: %s\"}}", code, what, why);
	return pack(result, (size_t)n < sizeof result ? (size_t)n : sizeof result - 1);
}

// path finds the value of "path" in the input object and NUL-terminates
// it in place. The schema makes it a string without escapes or quotes.
static char *path(char *json, uint32_t len) {
	char *end = json + len;
	char *p = strstr(json, "\"path\"");
	if (!p) {
		return NULL;
	}
	for (p += 6; p < end && *p != '"'; p++) {
	}
	char *start = ++p;
	for (; p < end && *p != '"'; p++) {
		if (*p == '\\') {
			return NULL;
		}
	}
	if (p >= end) {
		return NULL;
	}
	*p = 0;
	return start;
}

EXPORT("keel_call")
uint64_t keel_call(uint32_t ptr, uint32_t len) {
	if (ptr != (uint32_t)(uintptr_t)in || len >= in_cap) {
		return fail("internal", "keel_call", "the input is not in the keel_alloc buffer");
	}
	in[len] = 0;
	char *rel = path(in, len);
	if (!rel) {
		return fail("invalid_input", "path", "write it as a plain JSON string");
	}
	char file[256];
	snprintf(file, sizeof file, "/workspace/%s", rel);
	FILE *f = fopen(file, "rb");
	if (!f) {
		return fail(errno == ENOENT ? "not_found" : "io_error", rel, strerror(errno));
	}
	char buf[4096];
	unsigned long long lines = 0, bytes = 0;
	int last = '\n';
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
		for (size_t i = 0; i < n; i++) {
			lines += buf[i] == '\n';
		}
		bytes += n;
		last = buf[n - 1];
	}
	int err = ferror(f) ? errno : 0;
	fclose(f);
	if (err) {
		return fail("io_error", rel, strerror(err));
	}
	if (last != '\n') {
		lines++; // a last line without a newline still counts
	}
	int m = snprintf(result, sizeof result,
	                 "{\"output\":{\"path\":\"%s\",\"lines\":%llu,\"bytes\":%llu}}", rel, lines, bytes);
	return pack(result, (size_t)m);
}
