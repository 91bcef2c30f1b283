package vm_test

import (
	"context"
	"fmt"
	"log"

	"legato/rl/desktop/osworld/vm"
)

// Start a VM for worker slot 0 on an OSWorld base image, restore its clean
// snapshot between attempts, and remove it at the end. A collect run sweeps
// what a crashed run left behind before it starts any VM.
func ExampleStart() {
	ctx := context.Background()
	cfg := vm.Config{BaseImage: "/var/tmp/osworld/Ubuntu.qcow2"}
	if _, err := vm.Sweep(ctx, cfg); err != nil {
		log.Fatal(err)
	}
	v, err := vm.Start(ctx, cfg, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer v.Close()
	fmt.Println("guest server at", v.Ports().GuestURL())
	// ... run an attempt against the guest server ...
	if err := v.Revert(ctx); err != nil {
		log.Fatal(err)
	}
}
