package export_test

import (
	"fmt"

	"legato/rl/export"
	"legato/rl/schema"
)

// A group of four attempts where two solved the task: the solvers get +1,
// the others −1, with the population std; with the sample std (slime's,
// SkyRL's) ±√3/2, 1.155 times less. A group where every attempt got the
// same reward carries no signal, and its advantages are 0.
func ExampleAdvantages() {
	fmt.Println(export.Advantages([]float64{1, 0, 1, 0}, schema.PopulationStd))
	fmt.Printf("%.4f\n", export.Advantages([]float64{1, 0, 1, 0}, schema.SampleStd))
	fmt.Println(export.Advantages([]float64{1, 1, 1, 1}, schema.SampleStd))
	// Output:
	// [1 -1 1 -1]
	// [0.8660 -0.8660 0.8660 -0.8660]
	// [0 0 0 0]
}
