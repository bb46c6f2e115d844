package wasmtools

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Interrupting a guest.
//
// A deadline must stop a tool that loops forever inside its own code.
// wazero can do that itself (RuntimeConfig.WithCloseOnContextDone): at
// every loop header the compiled code leaves for Go to check whether the
// module was closed. Leaving for Go is what lets the Go scheduler and
// garbage collector stop the goroutine (native code cannot be
// preempted), but doing it on every loop iteration more than doubles the
// cost of guest code, because a Go guest has a loop in every function
// (its resumption dispatch); wazero also starts a goroutine per call to
// watch the context.
//
// keel instead rewrites each module before compiling it. It adds two
// mutable i32 globals, fuel and stop (stop exported as interruptGlobal),
// and one function, tick; and at the head of every loop it inserts
//
//	fuel = fuel - 1
//	if fuel == 0 { call tick }
//
// which compiles to a load, a subtract, a store and a branch. tick refills
// the fuel, leaves for Go once (memory.grow 0, which wazero runs in Go:
// the goroutine becomes preemptible, so a spinning guest never holds up
// a garbage collection for more than tickEvery iterations), then traps
// with unreachable if stop is set. To stop a call, the host sets stop to
// 1. Code without loops runs for a bounded time (recursion ends in a
// stack overflow trap), so every endless computation passes loop headers.
//
// A start section would run guest code inside InstantiateModule, before
// the host can arm the interrupt: a start function that loops forever
// would never return. The rewrite removes the start section and exports
// the start function as startExport instead; keel calls it right after
// instantiating, with the interrupt armed, before _start or _initialize
// (see callStart).
//
// Tables live outside linear memory: wazero allocates their entries
// itself, 8 bytes each, so a table.grow could take gigabytes the memory
// cap never sees. The rewrite adds two more exported i64 globals,
// memoryLimitGlobal (set by the host after instantiation; zero refuses
// every grow) and tableBytesGlobal (8 bytes per table entry so far), and
// per table a function that replaces every table.grow of it: it returns
// -1, as a failed grow does, when the tables' entries and the linear
// memory would exceed the limit, and sets tableRefusedGlobal; otherwise
// it grows the table and counts the new entries. The memory allocator
// counts the table bytes in turn (see memoryCap). A table's initial size
// is checked against the cap when the module loads (tableBytes).
//
// The rewrite decodes every instruction of every function body, so it
// also refuses a module whose code refers to a global or function that
// did not exist before the rewrite (it could otherwise reach the new
// ones and clear stop), and any instruction outside the WebAssembly 2.0
// features keel runs (wazero would refuse those too).

// UnsupportedError is why instrument refuses a module that may well be
// valid WebAssembly: it uses a feature whose code the rewrite cannot
// bound (the interrupt, the memory cap) or that wazero does not run.
// Load errors wrap it; find it with errors.As.
type UnsupportedError struct {
	// Feature names what the module uses: "tail calls", "threads
	// (atomic instructions)", "threads (a shared memory)", "exception
	// handling", "multiple memories", "a 64-bit memory",
	// "garbage-collected types" or "typed function references".
	Feature string
}

func (e *UnsupportedError) Error() string {
	return "uses " + e.Feature + ", which keel cannot bound"
}

// The names of what the rewrite exports. A module's own exports may not
// use the reservedPrefix.
const (
	reservedPrefix = "keel."
	// interruptGlobal is the global that stops a guest.
	interruptGlobal = "keel.interrupt"
	// startExport is the module's start function, if it has one.
	startExport = "keel.start"
	// memoryLimitGlobal is the memory cap in bytes, for the table grow
	// functions; the host sets it.
	memoryLimitGlobal = "keel.memory_limit"
	// tableBytesGlobal counts tableEntryBytes per table entry.
	tableBytesGlobal = "keel.table_bytes"
	// tableRefusedGlobal is set to 1 when a table grow is refused.
	tableRefusedGlobal = "keel.table_refused"
)

// tableEntryBytes is what a table entry costs: wazero keeps a table as a
// slice of uintptr.
const tableEntryBytes = 8

// tickEvery is how many loop iterations pass between two ticks.
const tickEvery = 10_000

// loopCheck is inserted after every loop's block type.
func loopCheck(fuel, tick []byte) []byte {
	var b []byte
	b = append(append(append(b, 0x23), fuel...), 0x41, 0x01, 0x6b) // fuel - 1
	b = append(append(b, 0x24), fuel...)                           // fuel =
	b = append(append(b, 0x23), fuel...)                           // fuel
	b = append(b, 0x45, 0x04, 0x40, 0x10)                          // == 0: if, call
	return append(append(b, tick...), 0x0b)                        // tick, end
}

// tickBody is the body of the tick function.
func tickBody(fuel, stop []byte) []byte {
	b := []byte{0x00, 0x41}                     // no locals; i32.const
	b = appendS32(b, tickEvery)                 // tickEvery
	b = append(append(b, 0x24), fuel...)        // fuel =
	b = append(b, 0x41, 0x00, 0x40, 0x00, 0x1a) // drop (memory.grow 0)
	b = append(append(b, 0x23), stop...)        // if stop
	b = append(b, 0x04, 0x40, 0x00, 0x0b)       // unreachable
	return append(b, 0x0b)
}

// rewriteGlobals are the encoded indices of the globals the rewrite adds.
type rewriteGlobals struct {
	fuel, stop, limit, tableBytes, refused []byte
}

// growBody is the body of the function that replaces table.grow of table
// x: (param ref i32) (result i32), with one i32 local for the result.
//
//	if table_bytes + delta*8 + memory.size*65536 > limit {
//	  refused = 1; return -1
//	}
//	r = table.grow x (ref, delta)
//	if r != -1 { table_bytes += delta*8 }
//	return r
func growBody(x uint32, g rewriteGlobals) []byte {
	b := []byte{0x01, 0x01, 0x7f}                                      // one i32 local
	b = append(append(b, 0x23), g.tableBytes...)                       // table_bytes
	b = append(b, 0x20, 0x01, 0xad, 0x42, tableEntryBytes, 0x7e, 0x7c) // + u64(delta) * 8
	b = append(b, 0x3f, 0x00, 0xad, 0x42, 0x10, 0x86, 0x7c)            // + u64(memory.size) << 16
	b = append(append(b, 0x23), g.limit...)                            // limit
	b = append(b, 0x56, 0x04, 0x40, 0x41, 0x01, 0x24)                  // > : if refused =
	b = append(append(b, g.refused...), 0x41, 0x7f, 0x0f, 0x0b)        // 1; return -1; end
	b = append(b, 0x20, 0x00, 0x20, 0x01, 0xfc, 0x0f)                  // table.grow
	b = appendU32(b, x)                                                // x
	b = append(b, 0x22, 0x02, 0x41, 0x7f, 0x47, 0x04, 0x40)            // r != -1: if
	b = append(append(b, 0x23), g.tableBytes...)                       // table_bytes
	b = append(b, 0x20, 0x01, 0xad, 0x42, tableEntryBytes, 0x7e, 0x7c) // + u64(delta) * 8
	b = append(append(b, 0x24), g.tableBytes...)                       // table_bytes =
	return append(b, 0x0b, 0x20, 0x02, 0x0b)                           // end; r
}

// Section ids, and their required order in a module.
const (
	secIDCustom    = 0
	secIDType      = 1
	secIDImport    = 2
	secIDFunction  = 3
	secIDTable     = 4
	secIDMemory    = 5
	secIDGlobal    = 6
	secIDExport    = 7
	secIDStart     = 8
	secIDElement   = 9
	secIDCode      = 10
	secIDData      = 11
	secIDDataCount = 12
	secIDTag       = 13
)

// sectionOrder ranks the known non-custom sections by their position in
// a module (the data count section sits between element and code, the
// tag section between memory and global).
var sectionOrder = map[byte]int{
	secIDType: 1, secIDImport: 2, secIDFunction: 3, secIDTable: 4, secIDMemory: 5,
	secIDTag: 6, secIDGlobal: 7, secIDExport: 8, secIDStart: 9, secIDElement: 10,
	secIDDataCount: 11, secIDCode: 12, secIDData: 13,
}

type modSection struct {
	id      byte
	payload []byte
}

// moduleCounts are the sizes of a module's index spaces, before the
// rewrite.
type moduleCounts struct {
	types, funcs, globals, memories uint32
	// tables holds the reference type of each table; tableMin sums
	// their initial sizes.
	tables   []byte
	tableMin uint64
	// start is the start function's index; hasStart says whether there
	// is one.
	start    uint32
	hasStart bool
}

// instrument returns bin with the interrupt added (see above). It does
// not validate the module beyond what the rewrite needs; wazero compiles
// and validates the result.
func instrument(bin []byte) ([]byte, error) {
	if len(bin) < 8 || string(bin[:4]) != "\x00asm" {
		return nil, errors.New("not a WebAssembly binary (no \\0asm header)")
	}
	if v := binary.LittleEndian.Uint32(bin[4:8]); v != 1 {
		return nil, fmt.Errorf("WebAssembly binary version %d; keel runs version 1", v)
	}
	var sections []modSection
	r := reader{b: bin, off: 8}
	last := 0
	for !r.done() {
		id := r.byte()
		size := r.u32()
		payload := r.bytes(int(size))
		if r.err != nil {
			return nil, fmt.Errorf("section %d: %w", id, r.err)
		}
		if id != secIDCustom {
			rank, ok := sectionOrder[id]
			if !ok {
				return nil, fmt.Errorf("unknown section id %d", id)
			}
			if rank <= last {
				return nil, fmt.Errorf("section %d is out of order or repeated", id)
			}
			last = rank
		}
		sections = append(sections, modSection{id, payload})
	}

	var n moduleCounts
	for _, s := range sections {
		sr := reader{b: s.payload}
		switch s.id {
		case secIDImport:
			if err := countImports(s.payload, &n); err != nil {
				return nil, err
			}
		case secIDType:
			n.types += sr.u32()
		case secIDFunction:
			n.funcs += sr.u32()
		case secIDGlobal:
			n.globals += sr.u32()
		case secIDMemory:
			count := sr.u32()
			n.memories += count
			for range min(count, 2) { // more than one is refused below
				flags := sr.byte()
				switch {
				case flags&0x02 != 0:
					return nil, &UnsupportedError{Feature: "threads (a shared memory)"}
				case flags&0x04 != 0:
					return nil, &UnsupportedError{Feature: "a 64-bit memory"}
				}
				sr.u32() // minimum
				if flags&1 != 0 {
					sr.u32() // maximum
				}
			}
		case secIDStart:
			n.start, n.hasStart = sr.u32(), true
		case secIDTable:
			for range sr.u32() {
				n.tables = append(n.tables, sr.byte())
				n.tableMin += uint64(sr.limits())
				if sr.err == nil && len(n.tables) > 1<<10 {
					return nil, errors.New("too many tables")
				}
			}
		case secIDTag:
			return nil, &UnsupportedError{Feature: "exception handling"}
		}
		if sr.err != nil {
			return nil, fmt.Errorf("section %d: %w", s.id, sr.err)
		}
	}
	if n.memories == 0 {
		return nil, errors.New("has no memory; a tool must define and export one")
	}
	if n.memories > 1 {
		return nil, &UnsupportedError{Feature: "multiple memories"}
	}
	if n.globals > 1<<20 || n.funcs > 1<<24 || n.types > 1<<20 {
		return nil, errors.New("too many globals, functions or types")
	}
	if n.hasStart && n.start >= n.funcs {
		return nil, fmt.Errorf("start function %d does not exist", n.start)
	}
	g := rewriteGlobals{
		fuel: appendU32(nil, n.globals), stop: appendU32(nil, n.globals+1),
		limit: appendU32(nil, n.globals+2), tableBytes: appendU32(nil, n.globals+3),
		refused: appendU32(nil, n.globals+4),
	}
	tick := appendU32(nil, n.funcs)
	check := loopCheck(g.fuel, tick)

	// What the rewrite adds to each section, after what is there: the
	// types of tick and of the grow functions of funcref and externref
	// tables; the functions tick and one grow function per table; five
	// globals; their exports and the start function's.
	types := []byte{0x60, 0x00, 0x00, 0x60, 0x02, 0x70, 0x7f, 0x01, 0x7f, 0x60, 0x02, 0x6f, 0x7f, 0x01, 0x7f}
	funcs := appendU32(nil, n.types)
	code := appendBody(nil, tickBody(g.fuel, g.stop))
	for x, ref := range n.tables {
		typ := n.types + 1
		if ref == 0x6f {
			typ++
		}
		funcs = appendU32(funcs, typ)
		code = appendBody(code, growBody(uint32(x), g))
	}
	globals := []byte{0x7f, 0x01, 0x41}
	globals = append(appendS32(globals, tickEvery), 0x0b)   // fuel
	globals = append(globals, 0x7f, 0x01, 0x41, 0x00, 0x0b) // stop
	globals = append(globals, 0x7e, 0x01, 0x42, 0x00, 0x0b) // limit
	globals = append(globals, 0x7e, 0x01, 0x42)             // table bytes
	globals = append(appendS64(globals, int64(n.tableMin*tableEntryBytes)), 0x0b)
	globals = append(globals, 0x7f, 0x01, 0x41, 0x00, 0x0b) // refused
	var export []byte
	for _, e := range []struct {
		name  string
		index []byte
	}{{interruptGlobal, g.stop}, {memoryLimitGlobal, g.limit}, {tableBytesGlobal, g.tableBytes}, {tableRefusedGlobal, g.refused}} {
		export = append(append(appendName(export, e.name), 0x03), e.index...)
	}
	exports := uint32(4)
	if n.hasStart {
		export = append(appendName(export, startExport), 0x00)
		export = appendU32(export, n.start)
		exports++
	}
	added := map[byte]struct {
		count   uint32
		entries []byte
	}{
		secIDType:     {3, types},
		secIDFunction: {1 + uint32(len(n.tables)), funcs},
		secIDGlobal:   {5, globals},
		secIDExport:   {exports, export},
		secIDCode:     {1 + uint32(len(n.tables)), code},
	}
	extend := func(id byte, payload []byte) ([]byte, error) {
		a := added[id]
		switch id {
		case secIDExport:
			if err := checkExports(payload); err != nil {
				return nil, err
			}
		case secIDCode:
			var err error
			if payload, err = instrumentCode(payload, n, check); err != nil {
				return nil, err
			}
		}
		sr := reader{b: payload}
		count := sr.u32()
		if sr.err != nil {
			return nil, fmt.Errorf("section %d: %w", id, sr.err)
		}
		out := appendU32(nil, count+a.count)
		out = append(out, payload[sr.off:]...)
		return append(out, a.entries...), nil
	}

	out := make([]byte, 0, len(bin)+len(bin)/8)
	out = append(out, bin[:8]...)
	emit := func(id byte, payload []byte) {
		out = append(out, id)
		out = appendU32(out, uint32(len(payload)))
		out = append(out, payload...)
	}
	done := map[byte]bool{}
	// emitMissing adds the sections the module lacks that rank before
	// rank.
	emitMissing := func(rank int) error {
		for _, id := range []byte{secIDType, secIDFunction, secIDGlobal, secIDExport, secIDCode} {
			if !done[id] && sectionOrder[id] < rank {
				payload, err := extend(id, []byte{0x00})
				if err != nil {
					return err
				}
				emit(id, payload)
				done[id] = true
			}
		}
		return nil
	}
	for _, s := range sections {
		if s.id == secIDCustom {
			emit(s.id, s.payload)
			continue
		}
		if s.id == secIDStart {
			continue // exported as startExport instead
		}
		if err := emitMissing(sectionOrder[s.id]); err != nil {
			return nil, err
		}
		payload := s.payload
		if _, ok := added[s.id]; ok {
			var err error
			if payload, err = extend(s.id, payload); err != nil {
				return nil, err
			}
			done[s.id] = true
		}
		emit(s.id, payload)
	}
	if err := emitMissing(len(sectionOrder) + 1); err != nil {
		return nil, err
	}
	return out, nil
}

// tableBytes returns what the initial sizes of the tables of the module
// bin take (tableEntryBytes per entry), which wazero allocates when it
// instantiates the module.
func tableBytes(bin []byte) (uint64, error) {
	r := reader{b: bin, off: 8}
	for !r.done() {
		id := r.byte()
		payload := r.bytes(int(r.u32()))
		if id != secIDTable {
			continue
		}
		sr := reader{b: payload}
		var entries uint64
		for range sr.u32() {
			sr.byte()
			entries += uint64(sr.limits())
		}
		return entries * tableEntryBytes, sr.err
	}
	return 0, r.err
}

// countImports adds the functions, globals and memories an import
// section imports to n.
func countImports(payload []byte, n *moduleCounts) error {
	r := reader{b: payload}
	count := r.u32()
	for i := uint32(0); i < count && r.err == nil; i++ {
		r.name()
		r.name()
		switch kind := r.byte(); kind {
		case 0x00: // func: type index
			r.u32()
			n.funcs++
		case 0x01: // table
			if r.err == nil {
				return errors.New("imports a table; a tool must define its own")
			}
		case 0x02: // memory: limits
			if flags := r.byte(); flags&0x02 != 0 && r.err == nil {
				return &UnsupportedError{Feature: "threads (a shared memory)"}
			} else if flags&1 != 0 {
				r.u32()
			}
			r.u32()
			n.memories++
		case 0x03: // global: valtype, mutability
			r.byte()
			r.byte()
			n.globals++
		default:
			if r.err == nil {
				return fmt.Errorf("import %d has unknown kind %d", i, kind)
			}
		}
	}
	if r.err != nil {
		return fmt.Errorf("import section: %w", r.err)
	}
	return nil
}

// checkExports refuses a module that exports a name keel reserves for
// what the rewrite exports.
func checkExports(payload []byte) error {
	r := reader{b: payload}
	count := r.u32()
	for i := uint32(0); i < count && r.err == nil; i++ {
		if name := r.name(); strings.HasPrefix(name, reservedPrefix) {
			return fmt.Errorf("exports %q; keel reserves names that begin with %q", name, reservedPrefix)
		}
		r.byte()
		r.u32()
	}
	if r.err != nil {
		return fmt.Errorf("export section: %w", r.err)
	}
	return nil
}

// instrumentCode rewrites every function body of a code section.
func instrumentCode(payload []byte, n moduleCounts, check []byte) ([]byte, error) {
	r := reader{b: payload}
	count := r.u32()
	out := make([]byte, 0, len(payload)+len(payload)/8)
	out = appendU32(out, count)
	var body []byte
	for i := uint32(0); i < count; i++ {
		size := r.u32()
		code := r.bytes(int(size))
		if r.err != nil {
			return nil, fmt.Errorf("code section: function %d: %w", i, r.err)
		}
		var err error
		body, err = instrumentBody(body[:0], code, n, check)
		if err != nil {
			return nil, fmt.Errorf("function body %d: %w", i, err)
		}
		out = appendBody(out, body)
	}
	if !r.done() {
		return nil, errors.New("code section: trailing bytes")
	}
	return out, nil
}

func appendBody(out, body []byte) []byte {
	return append(appendU32(out, uint32(len(body))), body...)
}

// instrumentBody copies one function body to out, inserting check after
// every loop's block type. It is the hot loop of a module load (a Go
// module has megabytes of code), so it scans the bytes directly with a
// table of immediate kinds rather than through reader.
func instrumentBody(out, code []byte, n moduleCounts, check []byte) ([]byte, error) {
	r := reader{b: code}
	groups := r.u32()
	for i := uint32(0); i < groups && r.err == nil; i++ {
		r.u32()  // count
		r.byte() // value type
	}
	if r.err != nil {
		return nil, fmt.Errorf("locals: %w", r.err)
	}
	b, i := code, r.off
	copied := 0
	depth := 1 // the body's own block, closed by its final end
	var ok bool
	for depth > 0 {
		if i >= len(b) {
			return nil, errors.New("body ends before its final end")
		}
		at := i
		op := b[i]
		i++
		ok = true
		switch immKinds[op] {
		case immNone:
		case immEnd:
			depth--
		case immBlock:
			i, ok = skipBlockType(b, i)
			depth++
		case immLoop:
			i, ok = skipBlockType(b, i)
			depth++
			if ok {
				out = append(out, b[copied:i]...)
				out = append(out, check...)
				copied = i
			}
		case immLEB:
			i, ok = skipLEB(b, i)
		case immLEB2:
			if i, ok = skipLEB(b, i); ok {
				i, ok = skipLEB(b, i)
			}
		case immGlobal, immFunc:
			var v uint32
			v, i, ok = readU32(b, i)
			limit := n.globals
			if immKinds[op] == immFunc {
				limit = n.funcs
			}
			if ok && v >= limit {
				what := "global"
				if immKinds[op] == immFunc {
					what = "function"
				}
				return nil, fmt.Errorf("refers to %s %d, which does not exist", what, v)
			}
		case immMemarg:
			i, ok = skipMemarg(b, i)
		case immFixed4:
			i += 4
		case immFixed8:
			i += 8
		case immByte:
			i++
		case immBrTable:
			var count uint32
			if count, i, ok = readU32(b, i); ok {
				for j := uint32(0); j <= count && ok; j++ {
					i, ok = skipLEB(b, i)
				}
			}
		case immSelectT:
			var count uint32
			if count, i, ok = readU32(b, i); ok {
				i += int(count)
			}
		default: // prefixed and unsupported instructions
			if sub, j, ok := readU32(b, i); op == 0xfc && ok && sub == 15 {
				// table.grow x becomes a call of x's grow function.
				var x uint32
				if x, j, ok = readU32(b, j); !ok {
					return nil, fmt.Errorf("instruction 0x%02x at byte %d: %w", op, at, errTruncated)
				}
				if x >= uint32(len(n.tables)) {
					return nil, fmt.Errorf("grows table %d, which does not exist", x)
				}
				out = append(out, b[copied:at]...)
				out = appendU32(append(out, 0x10), n.funcs+1+x)
				i, copied = j, j
				break
			}
			r := reader{b: b, off: i}
			if err := r.immediates(op); err != nil {
				return nil, fmt.Errorf("instruction 0x%02x at byte %d: %w", op, at, err)
			}
			if r.err != nil {
				return nil, fmt.Errorf("instruction 0x%02x at byte %d: %w", op, at, r.err)
			}
			i = r.off
		}
		if !ok || i > len(b) {
			return nil, fmt.Errorf("instruction 0x%02x at byte %d: %w", op, at, errTruncated)
		}
	}
	if i != len(b) {
		return nil, errors.New("bytes after the body's final end")
	}
	return append(out, b[copied:]...), nil
}

// Kinds of immediates, for instrumentBody's table.
const (
	immOther   = iota // prefixed or unsupported: reader.immediates decides
	immNone           // no immediates
	immEnd            // end
	immBlock          // block, if: a block type
	immLoop           // loop: a block type
	immLEB            // one LEB128
	immLEB2           // two LEB128s
	immGlobal         // global.get/set: a global index, checked
	immFunc           // call, ref.func: a function index, checked
	immMemarg         // loads and stores
	immFixed4         // f32.const
	immFixed8         // f64.const
	immByte           // ref.null: a reference type
	immBrTable        // br_table
	immSelectT        // select with types
)

var immKinds = func() (k [256]uint8) {
	for _, op := range []byte{0x00, 0x01, 0x05, 0x0f, 0x1a, 0x1b, 0xd1} {
		k[op] = immNone
	}
	for op := 0x45; op <= 0xc4; op++ {
		k[op] = immNone
	}
	k[0x0b] = immEnd
	k[0x02], k[0x04] = immBlock, immBlock
	k[0x03] = immLoop
	for _, op := range []byte{0x0c, 0x0d, 0x20, 0x21, 0x22, 0x25, 0x26, 0x3f, 0x40, 0x41, 0x42} {
		k[op] = immLEB
	}
	k[0x11] = immLEB2
	k[0x23], k[0x24] = immGlobal, immGlobal
	k[0x10], k[0xd2] = immFunc, immFunc
	for op := 0x28; op <= 0x3e; op++ {
		k[op] = immMemarg
	}
	k[0x43], k[0x44] = immFixed4, immFixed8
	k[0xd0] = immByte
	k[0x0e] = immBrTable
	k[0x1c] = immSelectT
	return k
}()

// skipLEB skips a LEB128 of at most 10 bytes at b[i:].
func skipLEB(b []byte, i int) (int, bool) {
	for end := min(i+10, len(b)); i < end; i++ {
		if b[i]&0x80 == 0 {
			return i + 1, true
		}
	}
	return i, false
}

// readU32 reads an unsigned LEB128 of at most 5 bytes at b[i:].
func readU32(b []byte, i int) (uint32, int, bool) {
	var v uint32
	for shift := 0; shift < 35 && i < len(b); shift += 7 {
		c := b[i]
		i++
		if shift == 28 && c > 0x0f {
			return 0, i, false
		}
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, i, true
		}
	}
	return 0, i, false
}

func skipMemarg(b []byte, i int) (int, bool) {
	align, i, ok := readU32(b, i)
	if ok && align&0x40 != 0 {
		i, ok = skipLEB(b, i)
	}
	if !ok {
		return i, false
	}
	return skipLEB(b, i)
}

func skipBlockType(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch b[i] {
	case 0x40, 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		return i + 1, true
	}
	return skipLEB(b, i)
}

// immediates skips the immediates of the instructions instrumentBody's
// table leaves to it: the 0xfc and 0xfd prefixes, and refuses the rest.
func (r *reader) immediates(op byte) error {
	switch op {
	case 0xfc:
		return r.miscImmediates(r.u32())
	case 0xfd:
		return r.simdImmediates(r.u32())
	case 0x12, 0x13, 0x15:
		return &UnsupportedError{Feature: "tail calls"}
	case 0xfe:
		return &UnsupportedError{Feature: "threads (atomic instructions)"}
	case 0x06, 0x07, 0x08, 0x09, 0x0a, 0x18, 0x19, 0x1f:
		return &UnsupportedError{Feature: "exception handling"}
	case 0xfb:
		return &UnsupportedError{Feature: "garbage-collected types"}
	case 0x14:
		return &UnsupportedError{Feature: "typed function references"}
	}
	return errors.New("unknown instruction")
}

func (r *reader) miscImmediates(sub uint32) error {
	switch {
	case sub <= 7: // saturating truncations
	case sub == 8: // memory.init: data index, memory
		r.u32()
		r.u32()
	case sub == 9: // data.drop
		r.u32()
	case sub == 10: // memory.copy: two memories
		r.u32()
		r.u32()
	case sub == 11: // memory.fill
		r.u32()
	case sub == 12 || sub == 14: // table.init, table.copy
		r.u32()
		r.u32()
	case sub == 13 || (sub >= 15 && sub <= 17): // elem.drop, table.grow/size/fill
		r.u32()
	default:
		return fmt.Errorf("unknown 0xfc instruction %d", sub)
	}
	return nil
}

func (r *reader) simdImmediates(sub uint32) error {
	switch {
	case sub <= 11: // loads, load-splats, store
		r.memarg()
	case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
		r.bytes(16)
	case sub >= 21 && sub <= 34: // extract_lane, replace_lane
		r.byte()
	case sub >= 84 && sub <= 91: // load_lane, store_lane
		r.memarg()
		r.byte()
	case sub == 92 || sub == 93: // load32_zero, load64_zero
		r.memarg()
	case sub <= 255:
		// the remaining SIMD instructions take no immediates
	default:
		return fmt.Errorf("unknown 0xfd instruction %d", sub)
	}
	return nil
}

// reader decodes a WebAssembly binary. The first error sticks: later
// reads return zero values and leave err unchanged.
type reader struct {
	b   []byte
	off int
	err error
}

var errTruncated = errors.New("unexpected end of module")

func (r *reader) done() bool { return r.err != nil || r.off >= len(r.b) }

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.b) {
		r.err = errTruncated
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.err = errTruncated
		return nil
	}
	b := r.b[r.off : r.off+n]
	r.off += n
	return b
}

// u32 reads an unsigned LEB128 of at most 5 bytes.
func (r *reader) u32() uint32 {
	var v uint32
	for i := 0; i < 5; i++ {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		if i == 4 && c > 0x0f {
			r.err = errors.New("integer too large")
			return 0
		}
		v |= uint32(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			return v
		}
	}
	return v
}

func (r *reader) name() string {
	n := r.u32()
	return string(r.bytes(int(n)))
}

// limits reads a table's or memory's limits and returns the minimum.
func (r *reader) limits() uint32 {
	flags := r.byte()
	min := r.u32()
	if flags&1 != 0 {
		r.u32()
	}
	return min
}

// memarg skips an alignment and an offset; with bit 6 of the alignment
// set (multiple memories) a memory index comes between them.
func (r *reader) memarg() {
	align := r.u32()
	if align&0x40 != 0 {
		r.u32()
	}
	r.u32()
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// appendS32 appends v as a signed LEB128 (the same bytes as its int64).
func appendS32(b []byte, v int32) []byte { return appendS64(b, int64(v)) }

// appendS64 appends v as a signed LEB128.
func appendS64(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func appendName(b []byte, s string) []byte {
	b = appendU32(b, uint32(len(s)))
	return append(b, s...)
}
