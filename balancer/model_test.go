package balancer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"weir/policy"
)

// TestAgainstModel drives a balancer with random picks, releases, failed
// connects, QoS weights, reloads, health reports and clock steps, and checks
// every outcome against a plain model of the documented rules: the target
// chosen could serve, weighted primaries, then primaries the QoS cut to 0,
// then backups in order; targets configured with weight 0 (draining) never;
// refusals only when nothing could serve, and open counts exact.
func TestAgainstModel(t *testing.T) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		for seed := range uint64(5) {
			t.Run(fmt.Sprintf("%v/%d", algo, seed), func(t *testing.T) {
				runModel(t, algo, seed)
			})
		}
	}
}

type modelTarget struct {
	open       int64
	downUntil  time.Time
	healthDown bool
}

func runModel(t *testing.T, algo policy.Algorithm, seed uint64) {
	// Small Maglev tables (still prime and ≫ 6 targets): the model rebuilds
	// hundreds of tables, and 65537 slots each is slow under -race.
	sizes := maglevSizes
	maglevSizes = [len(maglevSizes)]int{1021, 1021, 1021, 1021}
	defer func() { maglevSizes = sizes }()
	rng := rand.New(rand.NewPCG(seed, uint64(algo)))
	s := policy.BalancerSettings{
		Algorithm:     algo,
		RetryInterval: 2 * time.Second,
		SlowStart:     5 * time.Second,
		Health:        policy.HealthCheck{Interval: time.Second, Rise: 1, Fall: 1},
	}
	names := []string{"a", "b", "c", "d", "e", "f"}
	randomVS := func() *policy.VirtualServer {
		vs := &policy.VirtualServer{Name: "vs"}
		for _, i := range rng.Perm(len(names))[:1+rng.IntN(len(names))] {
			tg := &policy.Target{Name: names[i], Weight: rng.IntN(4), MaxConnections: int64(rng.IntN(4))}
			if rng.IntN(3) == 0 {
				tg.Role = policy.RoleBackup
			}
			vs.Targets = append(vs.Targets, tg)
		}
		return vs
	}
	vs := randomVS()
	b := mustNew(t, vs, s)
	model := map[string]*modelTarget{}
	eff := map[string][2]int{} // name → effective weight, base it applies to
	for _, tg := range vs.Targets {
		model[tg.Name] = &modelTarget{}
	}
	now := t0
	var held []Lease

	weight := func(tg *policy.Target) int {
		if tg.Weight <= 0 {
			return 0 // configured 0: draining
		}
		if e, ok := eff[tg.Name]; ok && e[1] == tg.Weight {
			return e[0]
		}
		return tg.Weight
	}
	// free: up and under its limit.
	free := func(tg *policy.Target) bool {
		m := model[tg.Name]
		return !m.healthDown && !now.Before(m.downUntil) && (tg.MaxConnections <= 0 || m.open < tg.MaxConnections)
	}
	// tier orders who may serve: 0 weighted primaries (every cut one too
	// when all are cut), 1 primaries cut to 0, 2 backups in order; 4
	// (never) targets configured with weight 0 (draining).
	tier := func(tg *policy.Target, allCut bool) int {
		switch {
		case tg.Weight <= 0:
			return 4
		case tg.Role == policy.RoleBackup:
			return 2
		case weight(tg) > 0 || allCut:
			return 0
		}
		return 1
	}

	for step := range 3000 {
		switch op := rng.IntN(20); {
		case op < 8: // pick
			allCut, positive := true, false
			for _, tg := range vs.Targets {
				if tg.Role == policy.RolePrimary && weight(tg) > 0 {
					allCut = false
				}
				if tg.Role == policy.RolePrimary && tg.Weight > 0 {
					positive = true
				}
			}
			allCut = allCut && positive
			best := 4 // the best tier that can serve
			var firstBackup *policy.Target
			for _, tg := range vs.Targets {
				if !free(tg) {
					continue
				}
				best = min(best, tier(tg, allCut))
				if tg.Role == policy.RoleBackup && tg.Weight > 0 && firstBackup == nil {
					firstBackup = tg
				}
			}
			l, err := b.PickAction(now, rng.Uint64(), nil, nil)
			if err != nil {
				var nt *NoTargetError
				if !errors.As(err, &nt) {
					t.Fatalf("step %d: %v is not a *NoTargetError", step, err)
				}
				if best < 4 {
					t.Fatalf("step %d: refused (%v) though a target could serve", step, err)
				}
				for _, tg := range vs.Targets {
					if !strings.Contains(err.Error(), tg.Name+" (") {
						t.Fatalf("step %d: refusal %q does not name %s", step, err, tg.Name)
					}
				}
				continue
			}
			var tg *policy.Target
			for _, x := range vs.Targets {
				if x.Name == l.Name() {
					tg = x
				}
			}
			switch {
			case tg == nil:
				t.Fatalf("step %d: picked %s, not in the configuration", step, l.Name())
			case !free(tg):
				t.Fatalf("step %d: picked %s, which cannot serve (%+v)", step, tg.Name, *model[tg.Name])
			case tier(tg, allCut) != best:
				t.Fatalf("step %d: picked %s of tier %d (weight %d/%d) while tier %d could serve", step, tg.Name, tier(tg, allCut), weight(tg), tg.Weight, best)
			case tg.Role == policy.RoleBackup && tg != firstBackup:
				t.Fatalf("step %d: picked backup %s, want the first that can serve, %s", step, tg.Name, firstBackup.Name)
			case l.Backup() != (tg.Role == policy.RoleBackup):
				t.Fatalf("step %d: Backup() %v for %s", step, l.Backup(), tg.Name)
			}
			model[tg.Name].open++
			held = append(held, l)
		case op < 12 && len(held) > 0: // close a connection
			i := rng.IntN(len(held))
			model[held[i].Name()].open--
			if rng.IntN(4) == 0 {
				held[i].Failed(now)
				model[held[i].Name()].downUntil = now.Add(s.RetryInterval)
			} else {
				held[i].Release()
			}
			held = append(held[:i], held[i+1:]...)
		case op < 14: // QoS sample
			w := map[string]int{}
			clear(eff)
			for _, tg := range vs.Targets {
				if rng.IntN(2) == 0 {
					w[tg.Name] = rng.IntN(4)
					eff[tg.Name] = [2]int{w[tg.Name], tg.Weight}
				}
			}
			b.SetWeights(w)
		case op < 15: // reload
			nvs := randomVS()
			b.Update(compile(t, nvs, s))
			in := map[string]bool{}
			for _, tg := range nvs.Targets {
				in[tg.Name] = true
				if model[tg.Name] == nil {
					model[tg.Name] = &modelTarget{} // a fresh state
				}
				if e, ok := eff[tg.Name]; ok && e[1] != tg.Weight {
					delete(eff, tg.Name)
				}
			}
			for name, m := range model {
				if !in[name] && m.open == 0 {
					delete(model, name)
					delete(eff, name)
				}
			}
			vs = nvs
		case op < 17: // health check result
			tg := vs.Targets[rng.IntN(len(vs.Targets))]
			ok := rng.IntN(3) > 0
			b.ReportHealth(tg.Name, ok, now)
			model[tg.Name].healthDown = !ok
		default:
			now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		}
		for _, ts := range b.Snapshot(now).Targets {
			if m := model[ts.Name]; ts.Open != m.open {
				t.Fatalf("step %d: %s has %d open, model %d", step, ts.Name, ts.Open, m.open)
			}
		}
	}
	for i := range held {
		held[i].Release()
	}
	for _, ts := range b.Snapshot(now).Targets {
		if ts.Open != 0 {
			t.Errorf("%s: %d open after all released", ts.Name, ts.Open)
		}
	}
}
