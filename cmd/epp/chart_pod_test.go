package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// podProcess is one container of a rendered Deployment run as a process, the way a kubelet runs it: the container's
// args after the image's entrypoint (the binary under test), exactly its environment with field references resolved
// from a real Pod object, and its ConfigMap volumes written to a directory that stands for the mount path. The
// process authenticates as the pod's service account (KUBECONFIG, in place of the token a kubelet mounts), so the
// API server enforces the chart's RBAC on it.
type podProcess struct {
	t         *testing.T
	container corev1.Container
	cmd       *exec.Cmd
	output    *runnertest.SyncBuffer
	exited    chan struct{}
	waitErr   error
}

// startPod creates a Pod from deploy's template in the API server and runs its container named container with
// binary. It fails the test if the container names a command (the image's entrypoint must run) or uses a volume or
// environment source a kubelet stand-in cannot honour.
func startPod(t *testing.T, api *runnertest.APIServer, deploy *appsv1.Deployment, container, binary string) *podProcess {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    deploy.Namespace,
			GenerateName: deploy.Name + "-",
			Labels:       deploy.Spec.Template.Labels,
		},
		Spec: deploy.Spec.Template.Spec,
	}
	if err := api.Client.Create(ctx, pod); err != nil {
		t.Fatalf("creating the pod of Deployment %s: %v", deploy.Name, err)
	}
	t.Cleanup(func() { _ = api.Client.Delete(context.Background(), pod) })

	var c *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container {
			c = &pod.Spec.Containers[i]
		}
	}
	if c == nil {
		t.Fatalf("Deployment %s has no container %q", deploy.Name, container)
	}
	if len(c.Command) > 0 || len(c.EnvFrom) > 0 {
		t.Fatalf("container %s: command %q, envFrom %v: the test runs the image's entrypoint with plain env", c.Name, c.Command, c.EnvFrom)
	}
	for _, p := range c.Ports {
		if l, err := net.Listen("tcp", fmt.Sprintf(":%d", p.ContainerPort)); err != nil {
			t.Fatalf("container port %s (%d) is taken on this machine; the test runs the container with its own ports: %v", p.Name, p.ContainerPort, err)
		} else {
			_ = l.Close()
		}
	}

	args := mountConfigMaps(t, api, pod, c)
	env := []string{"KUBECONFIG=" + api.ServiceAccountKubeconfig(t, pod.Namespace, pod.Spec.ServiceAccountName)}
	for _, e := range c.Env {
		env = append(env, e.Name+"="+envValue(t, pod, e))
	}
	p := &podProcess{t: t, container: *c, output: &runnertest.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if p.stop() != "exited 0" || t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(binary), p.output.String())
		}
	})
	return p
}

// mountConfigMaps writes the ConfigMap volumes c mounts into directories and returns c's args with each mount path
// replaced by its directory.
func mountConfigMaps(t *testing.T, api *runnertest.APIServer, pod *corev1.Pod, c *corev1.Container) []string {
	t.Helper()
	args := append([]string(nil), c.Args...)
	for _, m := range c.VolumeMounts {
		var cm *corev1.ConfigMapVolumeSource
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name {
				cm = v.ConfigMap
			}
		}
		if cm == nil || m.SubPath != "" {
			t.Fatalf("volume mount %s: only whole ConfigMap volumes are supported", m.Name)
		}
		var data corev1.ConfigMap
		if err := api.Client.Get(context.Background(), client.ObjectKey{Namespace: pod.Namespace, Name: cm.Name}, &data); err != nil {
			t.Fatalf("ConfigMap %s of volume %s: %v", cm.Name, m.Name, err)
		}
		dir := t.TempDir()
		for key, value := range data.Data {
			if err := os.WriteFile(filepath.Join(dir, key), []byte(value), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		mount := strings.TrimSuffix(m.MountPath, "/") + "/"
		for i := range args {
			args[i] = strings.ReplaceAll(args[i], mount, dir+"/")
		}
	}
	return args
}

// envValue resolves one environment variable as a kubelet does for the fields the charts use.
func envValue(t *testing.T, pod *corev1.Pod, e corev1.EnvVar) string {
	t.Helper()
	switch {
	case e.ValueFrom == nil:
		if strings.Contains(e.Value, "$(") {
			t.Fatalf("env %s: $(VAR) expansion is not supported", e.Name)
		}
		return e.Value
	case e.ValueFrom.FieldRef != nil:
		switch e.ValueFrom.FieldRef.FieldPath {
		case "metadata.namespace":
			return pod.Namespace
		case "metadata.name":
			return pod.Name
		}
	}
	t.Fatalf("env %s: source %+v is not supported", e.Name, e.ValueFrom)
	return ""
}

// port returns the container's port named name.
func (p *podProcess) port(name string) int32 {
	for _, cp := range p.container.Ports {
		if cp.Name == name {
			return cp.ContainerPort
		}
	}
	p.t.Fatalf("container %s has no port %q", p.container.Name, name)
	return 0
}

// probe runs a gRPC probe of the container (the charts' probes are gRPC) once.
func (p *podProcess) probe(pr *corev1.Probe) bool {
	if pr == nil || pr.GRPC == nil {
		p.t.Fatalf("container %s: want a gRPC probe, got %+v", p.container.Name, pr)
	}
	service := ""
	if pr.GRPC.Service != nil {
		service = *pr.GRPC.Service
	}
	return runnertest.Serving(p.t, &runnertest.Process{HealthPort: int(pr.GRPC.Port)}, service)
}

// waitReady waits until the readiness probe passes, failing the test if the process exits or 60s pass.
func (p *podProcess) waitReady() {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !p.probe(p.container.ReadinessProbe) {
		select {
		case <-p.exited:
			p.t.Fatalf("exited before it was ready: %v", p.waitErr)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatal("readiness probe not passing after 60s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitListening waits until the container accepts TCP connections on port, for at most 10s: a readiness probe may
// pass a moment before every server of the process listens (upstream's EPP reports ready before its ext_proc
// server binds), and a gateway retries such a refused connection.
func (p *podProcess) waitListening(port int32) {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			p.t.Errorf("nothing listens on container port %d 10s after the readiness probe passed: %v", port, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM, as a kubelet does, and says how the process ended ("exited 0", or why not) within 30s.
func (p *podProcess) stop() string {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			return "killed after 30s"
		}
	}
	if p.waitErr != nil {
		return p.waitErr.Error()
	}
	return "exited 0"
}
