package hostagent

import (
	"context"

	"legato/rl/desktop/osworld/vm"
)

// Local is the Forker of the host the agent runs on: package vm, with
// cfg's ForkDir, NamePrefix and guest ports (the fleet's) and its local
// libvirtd.
func Local(cfg vm.Config) Forker { return local{cfg} }

type local struct{ cfg vm.Config }

func (l local) Template(ctx context.Context, d vm.DomainRef) (Template, error) {
	t, err := vm.TemplateOf(ctx, l.cfg, d)
	if err != nil {
		return nil, err
	}
	return LocalTemplate(t), nil
}

func (l local) Reserve(p vm.Ports, on bool) { vm.ReservePorts(p, on) }

func (l local) Sweep() ([]string, error) {
	left, err := vm.SweepForks(l.ForkDir(), l.prefix())
	names := make([]string, len(left))
	for i, f := range left {
		names[i] = f.Dir
	}
	return names, err
}

func (l local) ForkDir() string {
	if l.cfg.ForkDir == "" {
		return vm.DefaultForkDir
	}
	return l.cfg.ForkDir
}

func (l local) prefix() string {
	if l.cfg.NamePrefix == "" {
		return vm.DefaultNamePrefix
	}
	return l.cfg.NamePrefix
}

// LocalTemplate is a template on this machine as a Template: the agent's
// own, and the fleet's for the VMs it runs here.
func LocalTemplate(t *vm.Template) Template { return localTemplate{t} }

type localTemplate struct{ *vm.Template }

func (t localTemplate) Fork(ctx context.Context) (Clone, error) {
	c, err := t.Template.Fork(ctx)
	if err != nil {
		return nil, err
	}
	return c, nil
}
