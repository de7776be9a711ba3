// CoreDNS with the plugins the cluster's Corefile uses and no others.
//
// Kubernetes' own CoreDNS add-on manifest (cluster/addons/dns/coredns in the k8s.io/kubernetes
// module) is what the local cluster installs. CoreDNS's own main imports every plugin
// (core/plugin), cloud DNS back-ends and their SDKs included; this one imports the plugins that
// Corefile names, as CoreDNS documents for builds with a chosen plugin set, and is otherwise
// CoreDNS's main. The directive order stays CoreDNS's own (core/dnsserver).
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
