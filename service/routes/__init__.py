"""One APIRouter per resource, mounted under /v1 by service.app (health probes at the root)."""
