package store

// LazyDelay is the writer's lazyDelay, for the tests.
const LazyDelay = lazyDelay
