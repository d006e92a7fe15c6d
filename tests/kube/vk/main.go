// Command vk is a virtual-kubelet node for healer's tests: the virtual-kubelet library's node,
// lease and pod controllers (github.com/virtual-kubelet/virtual-kubelet/node/nodeutil, the version
// pinned in go.mod) with an in-memory provider that behaves as upstream's mock provider does
// (cmd/virtual-kubelet/internal/provider/mock, which is internal to its command and cannot be
// imported): a pod bound to the node is Running and Ready at once; a deleted pod's containers are
// terminated, it is Succeeded, and the pod controller removes it from the API server.
//
// Where it differs from virtual-kubelet's command running the mock provider: the provider's pod
// map is guarded by a mutex (upstream's is not, and the pod controller calls it from several
// workers); the kubelet API listens on the address given (loopback in the tests), not on every
// interface, with a self-signed certificate made at start instead of one read from files.
//
// The node registers with nodeutil's labels (type=virtual-kubelet, kubernetes.io/role=agent),
// the taint virtual-kubelet's command puts by default (virtual-kubelet.io/provider=mock:NoSchedule),
// the capacity given by flags, and Lease heartbeats. It stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vkslog "github.com/virtual-kubelet/virtual-kubelet/log/slog"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	stats "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// provider keeps the node's pods in memory, as upstream's mock provider does.
type provider struct {
	mu       sync.Mutex
	pods     map[string]*corev1.Pod
	notifier func(*corev1.Pod)
}

func key(namespace, name string) string { return namespace + "/" + name }

// CreatePod "runs" the pod: Running, Ready, every container running (upstream mock's status).
func (p *provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    "127.0.0.1",
		PodIP:     "127.0.0.1",
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	p.store(pod)
	return nil
}

func (p *provider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	p.store(pod)
	return nil
}

func (p *provider) store(pod *corev1.Pod) {
	p.mu.Lock()
	p.pods[key(pod.Namespace, pod.Name)] = pod
	p.mu.Unlock()
	p.notifier(pod.DeepCopy())
}

// DeletePod terminates the pod's containers and reports it Succeeded (upstream mock's status);
// the pod controller then deletes it from the API server.
func (p *provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	_, known := p.pods[key(pod.Namespace, pod.Name)]
	delete(p.pods, key(pod.Namespace, pod.Name))
	p.mu.Unlock()
	if !known {
		return errdefs.NotFound("pod not found")
	}
	now := metav1.Now()
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.Reason = "MockProviderPodDeleted"
	for i, s := range pod.Status.ContainerStatuses {
		started := now
		if s.State.Running != nil {
			started = s.State.Running.StartedAt
		}
		pod.Status.ContainerStatuses[i].Ready = false
		pod.Status.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			Reason: "MockProviderPodContainerDeleted", StartedAt: started, FinishedAt: now,
		}}
	}
	p.notifier(pod)
	return nil
}

func (p *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pod, ok := p.pods[key(namespace, name)]; ok {
		return pod.DeepCopy(), nil
	}
	return nil, errdefs.NotFoundf("pod %q is not known to the provider", key(namespace, name))
}

func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

func (p *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		pods = append(pods, pod.DeepCopy())
	}
	return pods, nil
}

// NotifyPods makes the provider asynchronous (node.PodNotifier): status changes are pushed.
func (p *provider) NotifyPods(_ context.Context, notifier func(*corev1.Pod)) { p.notifier = notifier }

// The kubelet API's streaming and stats calls: nothing runs, so empty answers (as upstream's mock).
func (p *provider) GetContainerLogs(context.Context, string, string, string, api.ContainerLogOpts) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader("")), nil
}
func (p *provider) RunInContainer(context.Context, string, string, string, []string, api.AttachIO) error {
	return nil
}
func (p *provider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return nil
}
func (p *provider) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return nil
}
func (p *provider) GetStatsSummary(context.Context) (*stats.Summary, error) {
	return &stats.Summary{}, nil
}
func (p *provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, nil
}

// selfSigned is a TLS key pair for the kubelet API on host, generated at start (the API server,
// given no --kubelet-certificate-authority, does not verify it).
func selfSigned(host string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	template := x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "virtual-kubelet"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP(host)},
	}
	der, err := x509.CreateCertificate(rand.Reader, &template, &template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func run() error {
	var (
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig of the API server to register with")
		name       = flag.String("nodename", "virtual-kubelet", "the Node's name")
		listen     = flag.String("listen", "127.0.0.1:10250", "host:port of the kubelet API (HTTPS)")
		cpu        = flag.String("cpu", "20", "capacity: cpu (upstream mock's default)")
		memory     = flag.String("memory", "100Gi", "capacity: memory (upstream mock's default)")
		pods       = flag.String("pods", "20", "capacity: pods (upstream mock's default)")
		gpus       = flag.String("gpus", "16", "capacity: nvidia.com/gpu")
		taint      = flag.String("taint", "virtual-kubelet.io/provider=mock:NoSchedule", "the node's taint, key=value:effect (\"\": none)")
	)
	flag.Parse()
	vklog.L = vkslog.FromSlog(slog.New(slog.NewTextHandler(os.Stderr, nil)))

	capacity := corev1.ResourceList{}
	for resourceName, value := range map[corev1.ResourceName]string{
		corev1.ResourceCPU: *cpu, corev1.ResourceMemory: *memory, corev1.ResourcePods: *pods, "nvidia.com/gpu": *gpus,
	} {
		q, err := resource.ParseQuantity(value)
		if err != nil {
			return fmt.Errorf("capacity %s: %w", resourceName, err)
		}
		capacity[resourceName] = q
	}
	host, portText, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	port, err := strconv.ParseInt(portText, 10, 32)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	cert, err := selfSigned(host)
	if err != nil {
		return err
	}
	client, err := nodeutil.ClientsetFromEnv(*kubeconfig)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	newProvider := func(cfg nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		n := cfg.Node
		n.Status.Capacity = capacity
		n.Status.Allocatable = capacity
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}}
		n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
		n.Status.NodeInfo.OperatingSystem = "linux"
		n.Status.NodeInfo.Architecture = "amd64"
		n.Status.NodeInfo.KubeletVersion = "v1.37.1-vk-mock"
		n.Labels["kubernetes.io/os"] = "linux"
		n.Labels["kubernetes.io/arch"] = "amd64"
		return &provider{pods: map[string]*corev1.Pod{}}, nil, nil // nil: nodeutil's naive node provider
	}
	vk, err := nodeutil.NewNode(*name, newProvider,
		func(cfg *nodeutil.NodeConfig) error {
			cfg.HTTPListenAddr = *listen
			cfg.Handler = mux
			cfg.NumWorkers = 4
			if *taint != "" {
				t, err := parseTaint(*taint)
				if err != nil {
					return err
				}
				cfg.NodeSpec.Spec.Taints = append(cfg.NodeSpec.Spec.Taints, t)
			}
			return nil
		},
		nodeutil.WithClient(client),
		// The kubelet API lets every request in, as virtual-kubelet's command does when given no
		// client CA: it listens on loopback, and the API server (which has no kubelet client
		// certificate here) reaches it this way for logs and the node proxy.
		func(cfg *nodeutil.NodeConfig) error {
			cfg.Handler = api.InstrumentHandler(nodeutil.WithAuth(nodeutil.NoAuth(), cfg.Handler))
			return nil
		},
		nodeutil.WithTLSConfig(func(c *tls.Config) error { c.Certificates = []tls.Certificate{cert}; return nil }),
		nodeutil.AttachProviderRoutes(mux),
	)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go vk.Run(ctx) //nolint:errcheck // its error is read from Err() below
	if err := vk.WaitReady(ctx, time.Minute); err != nil {
		return err
	}
	slog.Info("ready", "node", *name)
	select {
	case <-ctx.Done():
		<-vk.Done()
		return nil
	case <-vk.Done():
		return vk.Err()
	}
}

// parseTaint reads key=value:effect (value optional), as kubectl taint writes it.
func parseTaint(s string) (corev1.Taint, error) {
	spec, effect, ok := strings.Cut(s, ":")
	if !ok {
		return corev1.Taint{}, fmt.Errorf("taint %q: want key=value:effect", s)
	}
	k, v, _ := strings.Cut(spec, "=")
	return corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffect(effect)}, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vk:", err)
		os.Exit(1)
	}
}
