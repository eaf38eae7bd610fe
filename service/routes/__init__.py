"""One APIRouter per resource, mounted under /v1 by service.app (health probes at the root), and what they
share: submitting a job, reading jobs as a key may see them, and streaming what a job released."""
