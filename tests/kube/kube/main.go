// Command kube is a multi-call binary: one link of the Kubernetes control plane for healer's tests.
//
// Usage: kube apiserver|controller-manager|scheduler|etcd [flags...]
package main

import (
	"fmt"
	"os"
	_ "time/tzdata" // for timeZone support in CronJob

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kube apiserver|controller-manager|scheduler|etcd [flags...]")
		os.Exit(2)
	}
	var command *cobra.Command
	switch os.Args[1] {
	case "apiserver":
		command = apiserver.NewAPIServerCommand()
	case "controller-manager":
		command = controllermanager.NewControllerManagerCommand()
	case "scheduler":
		command = scheduler.NewSchedulerCommand()
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, os.Args[2:]...))
		return
	default:
		fmt.Fprintf(os.Stderr, "unknown component %q\n", os.Args[1])
		os.Exit(2)
	}
	command.SetArgs(os.Args[2:])
	os.Exit(cli.Run(command))
}
