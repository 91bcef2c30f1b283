package export_test

import (
	"fmt"

	"legato/rl/export"
)

// A group of four attempts where two solved the task: the solvers get +1,
// the others −1. A group where every attempt got the same reward carries
// no signal, and its advantages are 0.
func ExampleAdvantages() {
	fmt.Println(export.Advantages([]float64{1, 0, 1, 0}))
	fmt.Println(export.Advantages([]float64{1, 1, 1, 1}))
	// Output:
	// [1 -1 1 -1]
	// [0 0 0 0]
}
