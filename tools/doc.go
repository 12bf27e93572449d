// Package tools holds what operators load beside Sluice's EPP, as upstream's tools/ does: a Grafana dashboard
// (dashboards/sluice.json) and Prometheus alerts as a PrometheusRule (alerts/sluice-alerts.yaml). It has no code; its
// test runs the EPP with every feature on, drives traffic through it, and fails if a panel or an alert names a metric
// or label that the EPP's /metrics does not expose.
package tools
