# Images and Knative deployment of the functions. Included from the Makefile.
#
#   make image FN=detect-failures                 build one function's image (.local/images/FN.tar,
#                                                 its bill of materials .local/images/FN.spdx.json)
#   make images                                   build every function's image
#   make sbom                                     the bills of materials of the archives again
#   make deploy FN=detect-failures REGISTRY=r     build, push, deploy that function only
#   make deploy-all REGISTRY=r                    every function, plus everything else in knative/
#   make release VERSION=x.y.z REGISTRY=r         the release's files in dist/, the same bytes
#                                                 every time (dev/tools/release.py)
#   make push REGISTRY=r                          build and push every function's image, and write
#                                                 their digests as Helm values,
#                                                 .local/deploy/image-values.yaml
#   make undeploy FN=detect-failures              remove that function's Service
#   make manifests REGISTRY=r [TAG=t]             render knative/ with these image names (stdout)
#   make revisions FN=detect-failures             list the function's Revisions
#   make rollback FN=detect-failures REVISION=detect-failures-00003
#   make rollforward FN=detect-failures           route to the latest Revision again
#   make webhook-cert                             self-signed webhook certificate (no cert-manager)
#
# Images are built without a daemon by default (CONTAINER=buildah, hack/build-image.sh: a Debian
# base made by mmdebstrap, then the Dockerfile with buildah) into OCI archives under
# .local/images/, which deploy pushes with skopeo. CONTAINER=docker (or podman) builds and pushes
# with that engine instead, as before.
#
# DEAD_LETTERS_IMAGE=NAME@sha256:DIGEST runs that image as the dead-letter sink (Knative's
# event_display, pinned in knative/dead-letters.yaml to the digest of one release): the
# event_display of the Eventing release you run.
#
# COMPONENTS adds kustomize components of knative/ to what is rendered and applied, e.g.
# COMPONENTS="cert-manager monitoring" (names: the folders of knative/components, and
# monitoring). A per-function deploy applies that function's Service (and the config it reads),
# nothing else: the other functions keep their Revisions.

#
# ADMISSION chooses how new pods get their exclusions (docs/install-choices.md, "Admission:
# webhook or policies"): "policies" adds the admission-policies component (MutatingAdmission-
# Policies, no webhook), "webhook" leaves the webhook, and "auto" (the default) takes policies
# when the cluster kubectl talks to serves admissionregistration.k8s.io/v1
# mutatingadmissionpolicies (Kubernetes 1.36), the webhook otherwise. The components
# without-serving and webhook-deployment replace the webhook's Knative Service with a
# Deployment the policies component does not remove: with them, auto means the webhook, and
# ADMISSION=policies is refused.

# Wherever this file is included, it must not become the Makefile's default goal.
KNR_SAVED_DEFAULT_GOAL := $(.DEFAULT_GOAL)

KNR_FUNCTIONS := detect-failures update-annotations mutate-admission sweep-failures assess-nodes label-nodes \
	annotate-usage score-nodes rebalance-nodes
KNR_NAMESPACE := kn-rescheduler
REGISTRY ?=
ifeq ($(origin TAG),undefined)
TAG := $(shell git describe --always --dirty 2>/dev/null || echo dev)
endif
CONTAINER ?= buildah
# Extra flags of the daemonless push, e.g. --dest-tls-verify=false for a plain-HTTP registry
# or --dest-authfile FILE.
SKOPEO_FLAGS ?=
KUBECTL ?= kubectl
COMPONENTS ?=
ADMISSION ?= auto
knr_webhook_only = $(filter without-serving webhook-deployment,$(COMPONENTS))
# Asked of the cluster only when a recipe expands it (recursive), once per use.
knr_admission = $(if $(filter auto,$(ADMISSION)),$(if $(knr_webhook_only),webhook,$(shell \
	$(KUBECTL) get --raw /apis/admissionregistration.k8s.io/v1 2>/dev/null \
	| grep -q '"mutatingadmissionpolicies"' && echo policies || echo webhook)),$(ADMISSION))
# Listed last: the component deletes the webhook's objects other components may have patched.
KNR_COMPONENTS = $(COMPONENTS) $(if $(filter policies,$(knr_admission)),admission-policies)
DEAD_LETTERS_IMAGE ?=
KNR_EVENT_DISPLAY := gcr.io/knative-releases/knative.dev/eventing/cmd/event_display
# Where the generated overlays and digests go (ignored by git).
KNR_WORK := .local/deploy
KNR_CERT_DIR ?= .local/webhook-cert
KNR_IMAGES := .local/images
# The daemonless build: the default engine, or buildah named by its path.
knr_daemonless = $(filter buildah,$(notdir $(CONTAINER)))

.PHONY: image images sbom push release deploy deploy-all undeploy manifests revisions rollback rollforward webhook-cert \
	knr-check-fn knr-check-registry knr-check-engine knr-check-admission

knr-check-admission:
	@case "$(ADMISSION)" in auto|webhook|policies) ;; \
	  *) echo "ADMISSION must be auto, webhook or policies (got '$(ADMISSION)')" >&2; exit 2;; esac
	@if [ "$(ADMISSION)" = policies ] && [ -n "$(knr_webhook_only)" ]; then \
	  echo "ADMISSION=policies cannot go with COMPONENTS $(knr_webhook_only): they run the webhook as a Deployment the policies component does not remove" >&2; exit 2; fi

knr-check-fn:
	@if [ -z "$(FN)" ] || ! echo " $(KNR_FUNCTIONS) " | grep -q " $(FN) "; then \
	  echo "FN must be one of: $(KNR_FUNCTIONS) (got '$(FN)')" >&2; exit 2; fi

knr-check-registry:
	@if [ -z "$(REGISTRY)" ]; then \
	  echo "REGISTRY is required (the repository prefix to push to, e.g. ghcr.io/acme/kn-rescheduler)" >&2; \
	  exit 2; fi

knr-check-engine:
ifneq ($(knr_daemonless),)
	@for t in mmdebstrap buildah skopeo; do command -v $$t >/dev/null 2>&1 || { \
	  echo "building images without a daemon needs mmdebstrap, buildah and skopeo: '$$t' is" \
	    "missing (hack/install-packages.sh installs them; CONTAINER=docker uses docker)" >&2; \
	  exit 1; }; done
else
	@if ! command -v $(CONTAINER) >/dev/null 2>&1; then \
	  echo "building images needs a container engine: '$(CONTAINER)' is not installed" \
	    "(CONTAINER=docker or CONTAINER=podman chooses one)" >&2; exit 1; fi
	@if ! $(CONTAINER) info >/dev/null 2>&1; then \
	  echo "building images needs a running container engine: '$(CONTAINER) info' fails" \
	    "(is its daemon running? CONTAINER=buildah builds without one)" >&2; exit 1; fi
endif

# The image reference of one function: REGISTRY/FN:TAG (kn-rescheduler/FN:TAG without REGISTRY).
knr_image = $(if $(REGISTRY),$(REGISTRY),kn-rescheduler)/$(1):$(TAG)

# Builds the images of the functions $(1): OCI archives $(KNR_IMAGES)/FN.tar without a daemon,
# or images in the engine's store with CONTAINER=docker/podman.
ifneq ($(knr_daemonless),)
knr_build = KNR_IMAGE_TAG=$(TAG) bash hack/build-image.sh --out $(KNR_IMAGES) $(1)
else
knr_build = $(foreach f,$(1),$(CONTAINER) build --build-arg FUNCTION=$(f) --build-arg VERSION=$(TAG) -t $(call knr_image,$(f)) . &&) true
endif

image: knr-check-fn knr-check-engine
	$(call knr_build,$(FN))

images: knr-check-engine
	$(call knr_build,$(KNR_FUNCTIONS))

# The daemonless build writes each archive's SPDX document beside it (dev/tools/sbom.py, read
# from the archive itself); this writes them again, e.g. after a change to the tool.
sbom:
	@ls $(KNR_IMAGES)/*.tar >/dev/null 2>&1 || { echo "no archives in $(KNR_IMAGES): make images" >&2; exit 1; }
	$(if $(wildcard .venv/bin/python),.venv/bin/python,python3) -m dev.tools.sbom $(KNR_IMAGES)/*.tar

# Build, push and write the pushed digest (registry/name@sha256:...) to $(KNR_WORK)/FN.digest.
# Daemonless: skopeo copies the archive to the registry (its credentials: skopeo login or
# REGISTRY_AUTH_FILE) and writes the digest of the manifest it pushed.
knr_push = \
	$(call knr_build,$(1)) && \
	mkdir -p $(KNR_WORK) && \
	if [ -n "$(knr_daemonless)" ]; then \
	  skopeo copy --quiet $(SKOPEO_FLAGS) --digestfile $(KNR_WORK)/$(1).sha \
	    oci-archive:$(KNR_IMAGES)/$(1).tar docker://$(call knr_image,$(1)) && \
	  echo "$(REGISTRY)/$(1)@$$(cat $(KNR_WORK)/$(1).sha)" > $(KNR_WORK)/$(1).digest; \
	elif [ "$$(basename $(CONTAINER))" = podman ]; then \
	  $(CONTAINER) push --digestfile $(KNR_WORK)/$(1).sha $(call knr_image,$(1)) && \
	  echo "$(REGISTRY)/$(1)@$$(cat $(KNR_WORK)/$(1).sha)" > $(KNR_WORK)/$(1).digest; \
	else \
	  $(CONTAINER) push $(call knr_image,$(1)) && \
	  $(CONTAINER) inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' \
	    $(call knr_image,$(1)) | grep -F "$(REGISTRY)/$(1)@" | head -n 1 > $(KNR_WORK)/$(1).digest; \
	fi && \
	test -s $(KNR_WORK)/$(1).digest || { echo "could not resolve the pushed digest of $(1)" >&2; exit 1; } && \
	echo "$(1): $$(cat $(KNR_WORK)/$(1).digest)"

# Writes the overlay $(KNR_WORK)/$(1)/kustomization.yaml: knative/ plus the components $(4), with the
# image of each function in $(2) set to its pushed digest (or to REGISTRY/FN:TAG if there is
# no digest file), and the dead-letter sink's to DEAD_LETTERS_IMAGE if given. Relative paths:
# kustomize refuses absolute ones in some versions.
knr_overlay = \
	mkdir -p $(KNR_WORK)/$(1) && \
	{ echo "apiVersion: kustomize.config.k8s.io/v1beta1"; \
	  echo "kind: Kustomization"; \
	  echo "resources:"; \
	  echo "  - ../../../knative"; \
	  if [ -n "$(strip $(4))" ]; then echo "components:"; fi; \
	  for c in $(4); do \
	    if [ "$$c" = monitoring ]; then echo "  - ../../../knative/monitoring"; \
	    else echo "  - ../../../knative/components/$$c"; fi; \
	  done; \
	  echo "images:"; \
	  for f in $(2); do \
	    echo "  - name: kn-rescheduler/$$f"; \
	    if [ -s $(KNR_WORK)/$$f.digest ] && [ "$(3)" = digest ]; then \
	      ref=$$(cat $(KNR_WORK)/$$f.digest); \
	      echo "    newName: $${ref%@*}"; echo "    digest: $${ref\#*@}"; \
	    else \
	      echo "    newName: $(if $(REGISTRY),$(REGISTRY),kn-rescheduler)/$$f"; echo "    newTag: $(TAG)"; \
	    fi; \
	  done; \
	  if [ -n "$(DEAD_LETTERS_IMAGE)" ]; then \
	    ref='$(DEAD_LETTERS_IMAGE)'; \
	    case "$$ref" in *@sha256:*) ;; *) \
	      echo "DEAD_LETTERS_IMAGE must name a digest: NAME@sha256:... (got $$ref)" >&2; exit 2;; \
	    esac; \
	    echo "  - name: $(KNR_EVENT_DISPLAY)"; \
	    echo "    newName: $${ref%@*}"; echo "    digest: $${ref\#*@}"; \
	  fi; } > $(KNR_WORK)/$(1)/kustomization.yaml

deploy: knr-check-fn knr-check-registry knr-check-engine
	@$(call knr_push,$(FN))
	@$(call knr_overlay,$(FN),$(FN),digest,$(KNR_COMPONENTS))
	$(KUBECTL) kustomize $(KNR_WORK)/$(FN) > $(KNR_WORK)/$(FN)/rendered.yaml
	# The settings it reads: a new, content-named ConfigMap, which no other function uses yet.
	$(KUBECTL) apply -f $(KNR_WORK)/$(FN)/rendered.yaml -l app.kubernetes.io/component=config
	# Only this function's Service (Knative Service, or the webhook Deployment variant).
	$(KUBECTL) apply -f $(KNR_WORK)/$(FN)/rendered.yaml \
	  -l app.kubernetes.io/name=$(FN),app.kubernetes.io/component=function
	@if [ "$(FN)" = mutate-admission ]; then \
	  $(KUBECTL) -n $(KNR_NAMESPACE) patch service mutate-admission-webhook --type=merge \
	    -p '{"spec":{"selector":{"serving.knative.dev/revision":null}}}' >/dev/null 2>&1 || true; fi
	@if $(KUBECTL) -n $(KNR_NAMESPACE) get ksvc $(FN) >/dev/null 2>&1; then \
	  $(KUBECTL) -n $(KNR_NAMESPACE) wait ksvc/$(FN) --for=condition=Ready --timeout=300s; \
	else \
	  $(KUBECTL) -n $(KNR_NAMESPACE) rollout status deployment/$(FN) --timeout=300s; fi

deploy-all: knr-check-admission knr-check-registry knr-check-engine
	@set -e; $(foreach f,$(KNR_FUNCTIONS),$(call knr_push,$(f));)
	@components="$(strip $(KNR_COMPONENTS))"; $(call knr_overlay,all,$(KNR_FUNCTIONS),digest,$$components)
	$(KUBECTL) kustomize $(KNR_WORK)/all > $(KNR_WORK)/all/rendered.yaml
	# Everything: namespace, RBAC, config, Broker, Triggers, sources, Services, admission.
	$(KUBECTL) apply -f $(KNR_WORK)/all/rendered.yaml
	@if grep -q "^kind: MutatingWebhookConfiguration" $(KNR_WORK)/all/rendered.yaml; then \
	  echo "Deployed, admission by the webhook. Without cert-manager (COMPONENTS=cert-manager), run: make webhook-cert"; \
	else echo "Deployed, admission by MutatingAdmissionPolicies: no webhook, no certificate."; fi

# The release's files (docs/install-helm.md, "Release files"): the images built with VERSION as
# their tag, then the manifests, the chart, the archives and their checksums.
release: knr-check-registry knr-check-engine
	@if [ -z "$(VERSION)" ]; then echo "VERSION is required (x.y.z)" >&2; exit 2; fi
	$(MAKE) --no-print-directory images TAG=$(VERSION) CONTAINER=$(CONTAINER)
	$(if $(wildcard .venv/bin/python),.venv/bin/python,python3) -m dev.tools.release \
	  --version $(VERSION) --registry $(REGISTRY) --images $(KNR_IMAGES) --out dist

# The chart's image values (docs/install-helm.md): the registry and each pushed digest.
push: knr-check-registry knr-check-engine
	@set -e; $(foreach f,$(KNR_FUNCTIONS),$(call knr_push,$(f));)
	@{ echo "# Written by make push: the images pushed to $(REGISTRY), by digest."; \
	  echo "image:"; echo "  registry: $(REGISTRY)"; echo "  digests:"; \
	  for f in $(KNR_FUNCTIONS); do ref=$$(cat $(KNR_WORK)/$$f.digest); \
	    echo "    $$f: $${ref#*@}"; done; } > $(KNR_WORK)/image-values.yaml
	@echo "helm values: $(KNR_WORK)/image-values.yaml"

undeploy: knr-check-fn
	@$(call knr_overlay,$(FN),$(FN),tag,$(COMPONENTS))
	$(KUBECTL) kustomize $(KNR_WORK)/$(FN) | $(KUBECTL) delete --ignore-not-found -f - \
	  -l app.kubernetes.io/name=$(FN),app.kubernetes.io/component=function

manifests: knr-check-admission
	@$(call knr_overlay,manifests,$(KNR_FUNCTIONS),tag,$(KNR_COMPONENTS))
	@$(KUBECTL) kustomize $(KNR_WORK)/manifests

revisions: knr-check-fn
	$(KUBECTL) -n $(KNR_NAMESPACE) get revisions -l serving.knative.dev/service=$(FN) \
	  --sort-by=.metadata.creationTimestamp

# Routes all of the function's traffic to REVISION (an earlier Revision keeps its image and its
# config, so this is a full rollback). The webhook's calls do not go through Knative's routing:
# for mutate-admission the ClusterIP Service is pinned to REVISION's pods as well.
rollback: knr-check-fn
	@if [ -z "$(REVISION)" ]; then echo "REVISION is required (see: make revisions FN=$(FN))" >&2; exit 2; fi
	@owner=$$($(KUBECTL) -n $(KNR_NAMESPACE) get revision $(REVISION) \
	  -o jsonpath='{.metadata.labels.serving\.knative\.dev/service}') || exit 1; \
	if [ "$$owner" != "$(FN)" ]; then \
	  echo "Revision $(REVISION) belongs to '$$owner', not to $(FN)" >&2; exit 2; fi
	$(KUBECTL) -n $(KNR_NAMESPACE) patch ksvc $(FN) --type=merge \
	  -p '{"spec":{"traffic":[{"revisionName":"$(REVISION)","percent":100}]}}'
	@if [ "$(FN)" = mutate-admission ]; then \
	  $(KUBECTL) -n $(KNR_NAMESPACE) patch service mutate-admission-webhook --type=merge \
	    -p '{"spec":{"selector":{"serving.knative.dev/revision":"$(REVISION)"}}}'; fi
	$(KUBECTL) -n $(KNR_NAMESPACE) wait ksvc/$(FN) --for=condition=Ready --timeout=300s
	@echo "$(FN) now serves from $(REVISION). 'make rollforward FN=$(FN)' or the next deploy undoes it."

rollforward: knr-check-fn
	$(KUBECTL) -n $(KNR_NAMESPACE) patch ksvc $(FN) --type=merge \
	  -p '{"spec":{"traffic":[{"latestRevision":true,"percent":100}]}}'
	@if [ "$(FN)" = mutate-admission ]; then \
	  $(KUBECTL) -n $(KNR_NAMESPACE) patch service mutate-admission-webhook --type=merge \
	    -p '{"spec":{"selector":{"serving.knative.dev/revision":null}}}'; fi

webhook-cert:
	KUBECTL='$(KUBECTL)' bash hack/webhook-cert.sh --out $(KNR_CERT_DIR) --apply

.DEFAULT_GOAL := $(KNR_SAVED_DEFAULT_GOAL)
