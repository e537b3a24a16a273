// Command kubelet-credential-harness runs the kubelet's own image credential provider code
// (k8s.io/kubernetes/pkg/credentialprovider/plugin, the package the kubelet links) outside a
// kubelet, so that tests can see what the kubelet would pull with. scripts/peers.sh builds it
// against the same k8s.io/kubernetes version as kube-apiserver; it is a test peer, not part
// of regbroker.
//
// Usage:
//
//	kubelet-credential-harness --config FILE|DIR --bin-dir DIR [--kubeconfig FILE]
//	    [--feature-gates K=V,...] [-v N] LOOKUP...
//
// where each LOOKUP is IMAGE (a pod without a ServiceAccount, as a static pod) or
// NAMESPACE/POD=IMAGE (the pod is read from the API server, as the kubelet has it).
//
// What it does, in the kubelet's order (pkg/kubelet/kuberuntime and pkg/kubelet/images):
//  1. plugin.RegisterCredentialProviderPlugins(config, binDir, tokenManager.GetServiceAccountToken,
//     getServiceAccount): reads and validates the CredentialProviderConfig and finds each
//     plugin binary; an error here is the kubelet's start-up error (the harness prints it
//     and exits 1, as the kubelet exits).
//  2. Per lookup: parsers.ParseImageName, then
//     plugin.NewExternalCredentialProviderDockerKeyring(podNamespace, podName, podUID,
//     serviceAccountName).Lookup(repository). The ServiceAccount token comes from the
//     kubelet's token manager (pkg/kubelet/token: a TokenRequest bound to the pod, for the
//     provider's audience) and the ServiceAccount from a GET, both against --kubeconfig.
//
// It prints one JSON document on stdout: the providers registered, then per lookup the
// credentials the kubelet would pass to the container runtime (username and password, and
// the ServiceAccount the kubelet tracks them to), the providers whose matchImages cover the
// image (the plugins the kubelet runs for it), and the errors the kubelet logged meanwhile
// (it logs them and pulls without credentials). The passwords are printed: it is a test
// tool. Nothing else is logged beyond what the kubelet itself logs (klog at -v).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/credentialprovider"
	"k8s.io/kubernetes/pkg/credentialprovider/plugin"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/token"
	"k8s.io/kubernetes/pkg/util/parsers"
	"sigs.k8s.io/yaml"
)

type credential struct {
	Username string `json:"username"`
	Password string `json:"password"`
	// The ServiceAccount the kubelet records as the credential's source (KEP-4412), if any.
	ServiceAccount *credentialprovider.ServiceAccountCoordinates `json:"serviceAccount,omitempty"`
}

type logged struct {
	Message  string `json:"message"`
	Error    string `json:"error"`
	Provider string `json:"provider,omitempty"`
}

type result struct {
	Image          string       `json:"image"`
	Repository     string       `json:"repository,omitempty"`
	Pod            string       `json:"pod,omitempty"`
	ServiceAccount string       `json:"serviceAccountName,omitempty"`
	Providers      []string     `json:"providers"`
	Found          bool         `json:"found"`
	Credentials    []credential `json:"credentials"`
	Errors         []logged     `json:"errors"`
}

// errorSink is klog's backend: every line goes to stderr as klog would write it, and the
// errors are also kept for the lookup being run.
type errorSink struct {
	mu   sync.Mutex
	errs []logged
}

func (s *errorSink) Init(logr.RuntimeInfo)          {}
func (s *errorSink) Enabled(int) bool               { return true }
func (s *errorSink) WithValues(...any) logr.LogSink { return s }
func (s *errorSink) WithName(string) logr.LogSink   { return s }
func (s *errorSink) Info(_ int, msg string, kv ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"I", msg}, kv...)...)
}
func (s *errorSink) Error(err error, msg string, kv ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"E", msg, "err", err}, kv...)...)
	e := logged{Message: msg, Error: fmt.Sprint(err)}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == "provider" {
			e.Provider = fmt.Sprint(kv[i+1])
		}
	}
	s.mu.Lock()
	s.errs = append(s.errs, e)
	s.mu.Unlock()
}
func (s *errorSink) take() []logged {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := s.errs
	s.errs = nil
	if errs == nil {
		errs = []logged{}
	}
	return errs
}

// matchImagesOf reads the providers' names and matchImages from the config (file or
// directory, as the kubelet reads it) once the kubelet has accepted it, for attribution only.
func matchImagesOf(path string) (map[string][]string, []string, error) {
	files := []string{path}
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		files = nil
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, nil, err
		}
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".json" || ext == ".yaml" || ext == ".yml") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		sort.Strings(files)
	}
	matches := map[string][]string{}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, err
		}
		var doc struct {
			Providers []struct {
				Name        string   `json:"name"`
				MatchImages []string `json:"matchImages"`
			} `json:"providers"`
		}
		if err := yaml.Unmarshal(data, &doc); err != nil {
			return nil, nil, err
		}
		for _, p := range doc.Providers {
			matches[p.Name] = p.MatchImages
			names = append(names, p.Name)
		}
	}
	return matches, names, nil
}

func fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	_ = json.NewEncoder(os.Stdout).Encode(map[string]string{"error": msg})
	fmt.Fprintln(os.Stderr, "kubelet-credential-harness:", msg)
	os.Exit(1)
}

func main() {
	configPath := flag.String("config", "", "the kubelet's --image-credential-provider-config")
	binDir := flag.String("bin-dir", "", "the kubelet's --image-credential-provider-bin-dir")
	kubeconfig := flag.String("kubeconfig", "", "the API server for ServiceAccounts, TokenRequests and pods (none: standalone, as a kubelet without one)")
	gates := flag.String("feature-gates", "", "the kubelet's --feature-gates (defaults of this Kubernetes version otherwise)")
	klog.InitFlags(nil) // -v, as the kubelet's
	flag.Parse()

	sink := &errorSink{}
	klog.SetLogger(logr.New(sink))
	if *gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*gates); err != nil {
			fail("--feature-gates: %v", err)
		}
	}

	// The kubelet's API client, token manager and ServiceAccount getter (pkg/kubelet/kubelet.go).
	var client kubernetes.Interface
	if *kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err != nil {
			fail("--kubeconfig: %v", err)
		}
		if client, err = kubernetes.NewForConfig(cfg); err != nil {
			fail("--kubeconfig: %v", err)
		}
	}
	tokenManager := token.NewManager(client)
	getServiceAccount := func(namespace, name string) (*v1.ServiceAccount, error) {
		return nil, fmt.Errorf("get service account is not implemented")
	}
	saMode := utilfeature.DefaultFeatureGate.Enabled(features.KubeletServiceAccountTokenForCredentialProviders)
	if saMode {
		getServiceAccount = func(namespace, name string) (*v1.ServiceAccount, error) {
			if client == nil {
				return nil, fmt.Errorf("cannot get ServiceAccounts when kubelet is in standalone mode")
			}
			return client.CoreV1().ServiceAccounts(namespace).Get(context.TODO(), name, metav1.GetOptions{})
		}
	}

	// 1. Start-up: the kubelet exits on this error.
	if err := plugin.RegisterCredentialProviderPlugins(*configPath, *binDir, tokenManager.GetServiceAccountToken, getServiceAccount); err != nil {
		fail("%v", err)
	}
	matches, names, err := matchImagesOf(*configPath)
	if err != nil {
		fail("re-reading %s: %v", *configPath, err)
	}

	// 2. One keyring lookup per LOOKUP, as before each pull (pkg/kubelet/images/image_manager.go).
	results := []result{}
	for _, arg := range flag.Args() {
		r := result{Image: arg, Providers: []string{}, Credentials: []credential{}}
		var podNamespace, podName, podUID, saName string
		if ref, image, ok := strings.Cut(arg, "="); ok {
			r.Image, r.Pod = image, ref
			ns, name, _ := strings.Cut(ref, "/")
			if client == nil {
				fail("%s: a pod needs --kubeconfig", arg)
			}
			pod, err := client.CoreV1().Pods(ns).Get(context.TODO(), name, metav1.GetOptions{})
			if err != nil {
				fail("%s: %v", arg, err)
			}
			saName = pod.Spec.ServiceAccountName
			if saMode {
				podNamespace, podName, podUID = pod.Namespace, pod.Name, string(pod.UID)
			}
		}
		r.ServiceAccount = saName
		repo, _, _, err := parsers.ParseImageName(r.Image)
		if err != nil {
			r.Errors = []logged{{Message: "ParseImageName", Error: err.Error()}}
			results = append(results, r)
			continue
		}
		r.Repository = repo
		for _, name := range names {
			for _, m := range matches[name] {
				if ok, _ := credentialprovider.URLsMatchStr(m, repo); ok {
					r.Providers = append(r.Providers, name)
					break
				}
			}
		}
		keyring := plugin.NewExternalCredentialProviderDockerKeyring(podNamespace, podName, podUID, saName)
		creds, found := keyring.Lookup(repo)
		r.Found = found
		for _, c := range creds {
			cred := credential{Username: c.Username, Password: c.Password}
			if c.Source != nil {
				cred.ServiceAccount = c.Source.ServiceAccount
			}
			r.Credentials = append(r.Credentials, cred)
		}
		r.Errors = sink.take()
		results = append(results, r)
	}
	out := map[string]any{"providers": names, "lookups": results}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fail("%v", err)
	}
}
