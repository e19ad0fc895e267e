package netpoltest

// Scenarios is the truth table: each scenario's expectations are written
// from the NetworkPolicy documentation, not from socklane's code.
func Scenarios() []Scenario {
	xa := Pod{"x", "a"}
	return []Scenario{
		{Name: "no-policies", Allow: func(Probe) bool { return true }},
		{
			Name: "deny-ingress-x",
			Policies: `
  - metadata: {name: deny-ingress, namespace: x}
    spec: {podSelector: {}}
`,
			Allow: func(p Probe) bool { return p.To.NS != "x" },
		},
		{
			Name: "deny-egress-x",
			Policies: `
  - metadata: {name: deny-egress, namespace: x}
    spec: {podSelector: {}, policyTypes: [Egress]}
`,
			Allow: func(p Probe) bool { return p.From.NS != "x" },
		},
		{
			Name: "deny-all-x",
			Policies: `
  - metadata: {name: deny-all, namespace: x}
    spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
`,
			Allow: func(p Probe) bool { return p.From.NS != "x" && p.To.NS != "x" },
		},
		{
			Name: "allow-same-namespace-x",
			Policies: `
  - metadata: {name: same-ns, namespace: x}
    spec:
      podSelector: {}
      ingress: [{from: [{podSelector: {}}]}]
`,
			Allow: func(p Probe) bool { return p.To.NS != "x" || p.From.NS == "x" },
		},
		{
			Name: "namespace-selector",
			Policies: `
  - metadata: {name: from-y, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.From.NS == "y" },
		},
		{
			Name: "pod-selector",
			Policies: `
  - metadata: {name: from-b, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.From == Pod{"x", "b"} },
		},
		{
			// The same policy after x/c is relabelled pod=b.
			Name: "pod-relabelled",
			Policies: `
  - metadata: {name: from-b, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]
`,
			Labels: map[string]map[string]string{"x/c": {"pod": "b"}},
			Allow:  func(p Probe) bool { return p.To != xa || p.From == Pod{"x", "b"} || p.From == Pod{"x", "c"} },
		},
		{
			Name: "namespace-and-pod-selector-and",
			Policies: `
  - metadata: {name: from-y-b, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchLabels: {pod: b}}}]}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.From == Pod{"y", "b"} },
		},
		{
			Name: "namespace-or-pod-selector",
			Policies: `
  - metadata: {name: from-y-or-b, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}, {podSelector: {matchLabels: {pod: b}}}]}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.From.NS == "y" || p.From == Pod{"x", "b"} },
		},
		{
			Name: "namespace-match-expressions",
			Policies: `
  - metadata: {name: from-y-z, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress:
        - from: [{namespaceSelector: {matchExpressions: [{key: ns, operator: In, values: [y, z]}]}}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.From.NS != "x" },
		},
		{
			Name: "pod-selector-not-in",
			Policies: `
  - metadata: {name: isolate-not-a, namespace: y}
    spec:
      podSelector: {matchExpressions: [{key: pod, operator: NotIn, values: [a]}]}
`,
			Allow: func(p Probe) bool { return p.To.NS != "y" || p.To.Name == "a" },
		},
		{
			Name: "ipblock-except",
			Policies: `
  - metadata: {name: cidr-but-yb, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{ipBlock: {cidr: "{{net}}", except: ["{{ip "y/b"}}/32"]}}]}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.From != Pod{"y", "b"} },
		},
		{
			Name: "port-80-tcp",
			Policies: `
  - metadata: {name: port-80, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{ports: [{port: 80, protocol: TCP}]}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.Port == Port{80, "tcp"} },
		},
		{
			Name: "named-port",
			Policies: `
  - metadata: {name: named, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{ports: [{port: serve-81-tcp}]}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.Port == Port{81, "tcp"} },
		},
		{
			Name: "end-port",
			Policies: `
  - metadata: {name: range, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{ports: [{protocol: TCP, port: 80, endPort: 81}]}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.Proto == "tcp" },
		},
		{
			Name: "udp-only",
			Policies: `
  - metadata: {name: udp-80, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{ports: [{protocol: UDP, port: 80}]}]
`,
			Allow: func(p Probe) bool { return p.To != xa || p.Port == Port{80, "udp"} },
		},
		{
			Name: "egress-to-namespace",
			Policies: `
  - metadata: {name: to-y, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      policyTypes: [Egress]
      egress: [{to: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
`,
			Allow: func(p Probe) bool { return p.From != xa || p.To.NS == "y" },
		},
		{
			Name: "egress-ipblock-except",
			Policies: `
  - metadata: {name: to-cidr-but-zc, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      policyTypes: [Egress]
      egress: [{to: [{ipBlock: {cidr: "{{net}}", except: ["{{ip "z/c"}}/32"]}}]}]
`,
			Allow: func(p Probe) bool { return p.From != xa || p.To != Pod{"z", "c"} },
		},
		{
			Name: "egress-named-port",
			Policies: `
  - metadata: {name: to-serve-80-udp, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      policyTypes: [Egress]
      egress: [{ports: [{protocol: UDP, port: serve-80-udp}]}]
`,
			Allow: func(p Probe) bool { return p.From != xa || p.Port == Port{80, "udp"} },
		},
		{
			Name: "union-of-policies",
			Policies: `
  - metadata: {name: from-y, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
  - metadata: {name: from-z-tcp, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{namespaceSelector: {matchLabels: {ns: z}}}], ports: [{port: 81}]}]
`,
			Allow: func(p Probe) bool {
				return p.To != xa || p.From.NS == "y" || (p.From.NS == "z" && p.Port == Port{81, "tcp"})
			},
		},
		{
			Name: "ingress-and-egress",
			Policies: `
  - metadata: {name: both, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      policyTypes: [Ingress, Egress]
      ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
      egress: [{to: [{namespaceSelector: {matchLabels: {ns: z}}}]}]
`,
			Allow: func(p Probe) bool {
				return (p.To != xa || p.From.NS == "y") && (p.From != xa || p.To.NS == "z")
			},
		},
		{
			Name: "allow-all-rule",
			Policies: `
  - metadata: {name: deny, namespace: x}
    spec: {podSelector: {}}
  - metadata: {name: allow-all, namespace: x}
    spec:
      podSelector: {}
      ingress: [{}]
`,
			Allow: func(Probe) bool { return true },
		},
		{
			Name: "deny-egress-but-dns",
			Policies: `
  - metadata: {name: dns-only, namespace: x}
    spec:
      podSelector: {}
      policyTypes: [Egress]
      egress: [{to: [{namespaceSelector: {}}], ports: [{protocol: UDP, port: 53}]}]
`,
			Ports: []Port{{80, "tcp"}, {53, "udp"}},
			Allow: func(p Probe) bool { return p.From.NS != "x" || p.Port == Port{53, "udp"} },
		},
	}
}
