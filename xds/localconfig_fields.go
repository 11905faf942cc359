package xds

import (
	"net/netip"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// config parses the document node.
func (p *parser) config(doc *yaml.Node) (*LocalConfig, error) {
	cfg := &LocalConfig{}
	root := doc
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			cfg.Raw = map[string]any{}
			return cfg, nil
		}
		root = doc.Content[0]
	}
	uids, keys, pkeys := map[string]bool{}, map[string]bool{}, map[string]bool{}
	err := p.mapping(root, rootPath, map[string]fieldFn{
		"workloads": func(n *yaml.Node, path string) error {
			return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
				w, err := p.workload(v, path)
				if err != nil {
					return err
				}
				if uids[w.UID] {
					return p.errorf(v, path, "duplicate workload uid %q", w.UID)
				}
				uids[w.UID] = true
				cfg.Workloads = append(cfg.Workloads, w)
				return nil
			})
		},
		"services": func(n *yaml.Node, path string) error {
			return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
				s, err := p.service(v, path)
				if err != nil {
					return err
				}
				if keys[s.Key()] {
					return p.errorf(v, path, "duplicate service %q", s.Key())
				}
				keys[s.Key()] = true
				cfg.Services = append(cfg.Services, s)
				return nil
			})
		},
		"policies": func(n *yaml.Node, path string) error {
			return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
				pol, err := p.policy(v, path)
				if err != nil {
					return err
				}
				if pkeys[pol.Key()] {
					return p.errorf(v, path, "duplicate policy %q", pol.Key())
				}
				pkeys[pol.Key()] = true
				cfg.Policies = append(cfg.Policies, pol)
				return nil
			})
		},
	})
	if err != nil {
		return nil, err
	}
	p.visits = 0
	if cfg.Raw, err = p.toAny(root, rootPath); err != nil {
		return nil, err
	}
	if cfg.Raw == nil {
		cfg.Raw = map[string]any{}
	}
	return cfg, nil
}

// --- workloads ---

func (p *parser) workload(n *yaml.Node, path string) (*state.Workload, error) {
	w := &state.Workload{}
	err := p.mapping(n, path, map[string]fieldFn{
		"uid":                   p.strField(&w.UID),
		"name":                  p.strField(&w.Name),
		"namespace":             p.nonEmpty(&w.Namespace),
		"workloadIps":           p.ipList(&w.Addresses),
		"hostname":              p.strField(&w.Hostname),
		"network":               p.strField(&w.Network),
		"protocol":              enumField(p, &w.Protocol, state.TunnelNone, state.TunnelHBONE),
		"trustDomain":           p.strField(&w.TrustDomain),
		"serviceAccount":        p.strField(&w.ServiceAccount),
		"waypoint":              p.gatewayField(&w.Waypoint),
		"networkGateway":        p.gatewayField(&w.NetworkGateway),
		"node":                  p.strField(&w.Node),
		"canonicalName":         p.strField(&w.CanonicalName),
		"canonicalRevision":     p.strField(&w.CanonicalRevision),
		"workloadType":          enumField(p, &w.WorkloadType, state.WorkloadDeployment, state.WorkloadJob),
		"workloadName":          p.strField(&w.WorkloadName),
		"nativeTunnel":          p.boolField(&w.NativeTunnel),
		"applicationTunnel":     p.appTunnelField(&w.ApplicationTunnel),
		"services":              p.workloadServices(&w.Services),
		"authorizationPolicies": p.keyList(&w.AuthorizationPolicies),
		"status":                enumField(p, &w.Status, state.StatusHealthy, state.StatusUnhealthy),
		"clusterId":             p.strField(&w.ClusterID),
		"locality":              p.localityField(&w.Locality),
		"networkMode":           enumField(p, &w.NetworkMode, state.NetworkStandard, state.NetworkHost),
		"capacity":              p.uint32Field(&w.Capacity),
	}, "namespace", "workloadIps")
	if err != nil {
		return nil, err
	}
	if w.UID == "" {
		if w.Name == "" {
			return nil, p.errorf(n, keyPath(path, "uid"), "uid or name is required")
		}
		w.UID = w.Namespace + "/" + w.Name
	}
	return w, nil
}

// nonEmpty parses a required string that may not be empty.
func (p *parser) nonEmpty(dst *string) fieldFn {
	return func(n *yaml.Node, path string) error {
		s, err := p.str(n, path)
		if err == nil && s == "" {
			err = p.errorf(n, path, "must not be empty")
		}
		*dst = s
		return err
	}
}

func (p *parser) ipList(dst *[]netip.Addr) fieldFn {
	return func(n *yaml.Node, path string) error {
		*dst = []netip.Addr{}
		return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
			s, err := p.str(v, path)
			if err != nil {
				return err
			}
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				return p.errorf(v, path, "invalid IP address %q", s)
			}
			*dst = append(*dst, a.Unmap())
			return nil
		})
	}
}

// keyList parses a list of "namespace/name" keys.
func (p *parser) keyList(dst *[]string) fieldFn {
	return func(n *yaml.Node, path string) error {
		return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
			s, err := p.str(v, path)
			if err != nil {
				return err
			}
			if !validKey(s) {
				return p.errorf(v, path, "%q is not namespace/name", s)
			}
			*dst = append(*dst, s)
			return nil
		})
	}
}

func validKey(s string) bool {
	ns, name, ok := strings.Cut(s, "/")
	return ok && ns != "" && name != ""
}

func (p *parser) workloadServices(dst *map[string]state.PortMap) fieldFn {
	return func(n *yaml.Node, path string) error {
		n, err := p.node(n, path)
		if err != nil {
			return err
		}
		if isNull(n) {
			return nil
		}
		if n.Kind != yaml.MappingNode {
			return p.errorf(n, path, "expected a mapping of namespace/hostname to ports, got %s", describe(n))
		}
		*dst = map[string]state.PortMap{}
		return p.pairs(n, path, func(k string, kn, v *yaml.Node) error {
			if !validKey(k) {
				return p.errorf(kn, keyPath(path, k), "%q is not namespace/hostname", k)
			}
			ports, err := p.portMap(v, keyPath(path, k))
			(*dst)[k] = ports
			return err
		})
	}
}

// gateway parses {destination: "network/IP" | "namespace/hostname",
// hboneMtlsPort: N}.
func (p *parser) gateway(n *yaml.Node, path string) (*state.GatewayAddress, error) {
	var dest string
	var port uint16
	var destNode *yaml.Node
	err := p.mapping(n, path, map[string]fieldFn{
		"destination": func(n *yaml.Node, path string) (err error) {
			destNode = n
			dest, err = p.str(n, path)
			return err
		},
		"hboneMtlsPort": p.portField(&port),
	}, "destination")
	if err != nil {
		return nil, err
	}
	g, err := state.ParseGatewayDestination(dest, port)
	if err != nil {
		return nil, p.errorf(destNode, keyPath(path, "destination"), "%v", err)
	}
	return g, nil
}

func (p *parser) gatewayField(dst **state.GatewayAddress) fieldFn {
	return func(n *yaml.Node, path string) (err error) {
		if r, err := p.node(n, path); err != nil || isNull(r) {
			return err
		}
		*dst, err = p.gateway(n, path)
		return err
	}
}

func (p *parser) appTunnelField(dst **state.ApplicationTunnel) fieldFn {
	return func(n *yaml.Node, path string) error {
		if r, err := p.node(n, path); err != nil || isNull(r) {
			return err
		}
		t := &state.ApplicationTunnel{}
		*dst = t
		return p.mapping(n, path, map[string]fieldFn{
			"protocol": enumField(p, &t.Protocol, state.AppTunnelNone, state.AppTunnelProxy),
			"port":     p.portField(&t.Port),
		})
	}
}

func (p *parser) localityField(dst *state.Locality) fieldFn {
	return func(n *yaml.Node, path string) error {
		return p.mapping(n, path, map[string]fieldFn{
			"region":  p.strField(&dst.Region),
			"zone":    p.strField(&dst.Zone),
			"subzone": p.strField(&dst.Subzone),
		})
	}
}

// --- services ---

func (p *parser) service(n *yaml.Node, path string) (*state.Service, error) {
	s := &state.Service{}
	err := p.mapping(n, path, map[string]fieldFn{
		"name":      p.strField(&s.Name),
		"namespace": p.nonEmpty(&s.Namespace),
		"hostname":  p.nonEmpty(&s.Hostname),
		"vips": func(n *yaml.Node, path string) error {
			return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
				str, err := p.str(v, path)
				if err != nil {
					return err
				}
				a, err := state.ParseNetworkAddress(str)
				if err != nil {
					return p.errorf(v, path, "%v", err)
				}
				s.VIPs = append(s.VIPs, a)
				return nil
			})
		},
		"cidrVips": func(n *yaml.Node, path string) error {
			return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
				str, err := p.str(v, path)
				if err != nil {
					return err
				}
				np, err := state.ParseNetworkPrefix(str)
				if err != nil {
					return p.errorf(v, path, "%v", err)
				}
				s.CIDRVIPs = append(s.CIDRVIPs, np)
				return nil
			})
		},
		"ports": func(n *yaml.Node, path string) (err error) {
			s.Ports, err = p.portMap(n, path)
			return err
		},
		"subjectAltNames":   p.strList(&s.SubjectAltNames),
		"waypoint":          p.gatewayField(&s.Waypoint),
		"weightedWaypoints": p.weightedWaypoints(&s.WeightedWaypoints),
		"loadBalancer":      p.loadBalancerField(&s.LoadBalancer),
		"ipFamilies":        enumField(p, &s.IPFamilies, state.FamiliesIPv4Only, state.FamiliesDual),
		"canonical":         p.boolField(&s.Canonical),
		"visibility":        enumField(p, &s.Visibility, state.VisibilityPublic, state.VisibilityNamespace),
	}, "namespace", "hostname")
	if err != nil {
		return nil, err
	}
	if strings.Contains(s.Namespace, "/") {
		return nil, p.errorf(n, keyPath(path, "namespace"), "must not contain /")
	}
	return s, nil
}

func (p *parser) weightedWaypoints(dst *[]state.WeightedWaypoint) fieldFn {
	return func(n *yaml.Node, path string) error {
		return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
			var dest string
			var destNode *yaml.Node
			var ww state.WeightedWaypoint
			err := p.mapping(v, path, map[string]fieldFn{
				"destination": func(n *yaml.Node, path string) (err error) {
					destNode = n
					dest, err = p.str(n, path)
					return err
				},
				"hboneMtlsPort": p.portField(&ww.Destination.HBONEMTLSPort),
				"weight":        p.uint32Field(&ww.Weight),
			}, "destination")
			if err != nil {
				return err
			}
			g, err := state.ParseGatewayDestination(dest, ww.Destination.HBONEMTLSPort)
			if err != nil {
				return p.errorf(destNode, keyPath(path, "destination"), "%v", err)
			}
			ww.Destination = *g
			*dst = append(*dst, ww)
			return nil
		})
	}
}

func (p *parser) loadBalancerField(dst **state.LoadBalancer) fieldFn {
	return func(n *yaml.Node, path string) error {
		if r, err := p.node(n, path); err != nil || isNull(r) {
			return err
		}
		lb := &state.LoadBalancer{}
		*dst = lb
		return p.mapping(n, path, map[string]fieldFn{
			"routingPreferences": func(n *yaml.Node, path string) error {
				return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
					sc, err := parseEnumNode(p, v, path, state.ScopeRegion, state.ScopeNetwork)
					lb.RoutingPreference = append(lb.RoutingPreference, sc)
					return err
				})
			},
			"mode":         enumField(p, &lb.Mode, state.LBStandard, state.LBPassthrough),
			"healthPolicy": enumField(p, &lb.HealthPolicy, state.OnlyHealthy, state.AllowAll),
		})
	}
}

// --- policies ---

func (p *parser) policy(n *yaml.Node, path string) (*rbac.Policy, error) {
	pol := &rbac.Policy{}
	err := p.mapping(n, path, map[string]fieldFn{
		"name":      p.nonEmpty(&pol.Name),
		"namespace": p.nonEmpty(&pol.Namespace),
		"scope":     enumField(p, &pol.Scope, rbac.Global, rbac.WorkloadSelector),
		"action":    enumField(p, &pol.Action, rbac.Allow, rbac.Deny),
		"dryRun":    p.boolField(&pol.DryRun),
		"rules": func(n *yaml.Node, path string) error {
			return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
				var rule rbac.Rule
				err := p.sequence(v, path, func(_ int, v *yaml.Node, path string) error {
					var clause rbac.Clause
					err := p.sequence(v, path, func(_ int, v *yaml.Node, path string) error {
						m, err := p.match(v, path)
						clause.Matches = append(clause.Matches, m)
						return err
					})
					rule.Clauses = append(rule.Clauses, clause)
					return err
				})
				pol.Rules = append(pol.Rules, rule)
				return err
			})
		},
	}, "name", "namespace", "scope", "action")
	if err != nil {
		return nil, err
	}
	if err := pol.Validate(); err != nil {
		return nil, p.errorf(n, path, "%v", err)
	}
	return pol, nil
}

func (p *parser) match(n *yaml.Node, path string) (rbac.Match, error) {
	var m rbac.Match
	err := p.mapping(n, path, map[string]fieldFn{
		"namespaces":          p.stringMatches(&m.Namespaces),
		"notNamespaces":       p.stringMatches(&m.NotNamespaces),
		"principals":          p.stringMatches(&m.Principals),
		"notPrincipals":       p.stringMatches(&m.NotPrincipals),
		"serviceAccounts":     p.serviceAccounts(&m.ServiceAccounts),
		"notServiceAccounts":  p.serviceAccounts(&m.NotServiceAccounts),
		"sourceIps":           p.prefixes(&m.SourceIPs),
		"notSourceIps":        p.prefixes(&m.NotSourceIPs),
		"destinationIps":      p.prefixes(&m.DestinationIPs),
		"notDestinationIps":   p.prefixes(&m.NotDestinationIPs),
		"destinationPorts":    p.ports(&m.DestinationPorts),
		"notDestinationPorts": p.ports(&m.NotDestinationPorts),
	})
	return m, err
}

// stringMatches parses a list of single-key maps {Exact|Prefix|Suffix: s}
// or {Presence: []}.
func (p *parser) stringMatches(dst *[]rbac.StringMatch) fieldFn {
	return func(n *yaml.Node, path string) error {
		return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
			v, err := p.node(v, path)
			if err != nil {
				return err
			}
			if v.Kind != yaml.MappingNode || len(v.Content) != 2 {
				return p.errorf(v, path, "expected a single-key mapping {Exact|Prefix|Suffix: string} or {Presence: []}, got %s", describe(v))
			}
			var sm rbac.StringMatch
			err = p.pairs(v, path, func(k string, kn, val *yaml.Node) error {
				kind, err := parseEnumNode(p, kn, path, rbac.Exact, rbac.Presence)
				if err != nil {
					return err
				}
				sm.Kind = kind
				kp := keyPath(path, k)
				if kind != rbac.Presence {
					sm.Value, err = p.str(val, kp)
					return err
				}
				val, err = p.node(val, kp)
				if err != nil {
					return err
				}
				if !isNull(val) && (val.Kind != yaml.SequenceNode || len(val.Content) != 0) {
					return p.errorf(val, kp, "expected [], got %s", describe(val))
				}
				return nil
			})
			*dst = append(*dst, sm)
			return err
		})
	}
}

func (p *parser) serviceAccounts(dst *[]rbac.ServiceAccountMatch) fieldFn {
	return func(n *yaml.Node, path string) error {
		return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
			var sa rbac.ServiceAccountMatch
			err := p.mapping(v, path, map[string]fieldFn{
				"namespace":      p.strField(&sa.Namespace),
				"serviceAccount": p.strField(&sa.ServiceAccount),
			}, "namespace", "serviceAccount")
			*dst = append(*dst, sa)
			return err
		})
	}
}

func (p *parser) prefixes(dst *[]netip.Prefix) fieldFn {
	return func(n *yaml.Node, path string) error {
		return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
			s, err := p.str(v, path)
			if err != nil {
				return err
			}
			pfx, err := state.ParsePrefix(s)
			if err != nil {
				return p.errorf(v, path, "%v", err)
			}
			*dst = append(*dst, pfx)
			return nil
		})
	}
}

func (p *parser) ports(dst *[]uint16) fieldFn {
	return func(n *yaml.Node, path string) error {
		return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
			port, err := p.uint(v, path, 65535)
			*dst = append(*dst, uint16(port))
			return err
		})
	}
}
