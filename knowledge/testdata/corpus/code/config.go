// Package config reads the service configuration.
package config

import (
	"encoding/json"
	"os"
)

// Config is the service configuration.
type Config struct {
	Listen string
	Debug  bool
}

// ParseConfig reads a JSON configuration file and checks the listen
// address.
func ParseConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	err = json.Unmarshal(b, &c)
	return c, err
}

// Greeting returns the banner printed at start-up.
func Greeting(name string) string {
	return "hello, " + name
}
