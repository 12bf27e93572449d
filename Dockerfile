# Sluice EPP image for machines with Docker. NOT built or tested in CI or on
# the development machines (they have no Docker): the supported path is
# `make image` (hack/image.mk, ko + hack/image), whose output
# hack/image/image_test.go checks. Keep the two in step: same static build,
# same ldflags (.ko.yaml), entrypoint /epp, user 65532, ports, labels.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg COMMIT=$(git rev-parse HEAD) -t sluice/epp:dev .
ARG BUILDER_IMAGE=golang:1.26
ARG BASE_IMAGE=gcr.io/distroless/static:nonroot

FROM ${BUILDER_IMAGE} AS builder
ENV CGO_ENABLED=0 GOOS=linux GOARCH=amd64
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN go build -trimpath \
    -ldflags="-s -w -X github.com/sluice-gw/sluice/runner.version=${VERSION} -X github.com/sluice-gw/sluice/runner.commit=${COMMIT}" \
    -o /epp ./cmd/epp

FROM ${BASE_IMAGE}
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.source="https://github.com/sluice-gw/sluice" \
      org.opencontainers.image.title="sluice-epp" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
WORKDIR /
COPY --from=builder /epp /epp
USER 65532:65532
# ext-proc gRPC, gRPC health, Prometheus metrics (upstream EPP defaults).
EXPOSE 9002 9003 9090
ENTRYPOINT ["/epp"]
