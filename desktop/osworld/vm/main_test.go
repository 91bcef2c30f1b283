package vm

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// atExit are what the package's tests leave for the end of the run (the
// boot cache the integration tests share).
var atExit []func()

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		for _, f := range atExit {
			f()
		}
		os.Exit(code)
	}))
}
