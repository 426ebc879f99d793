"""OpenAPI description of the bearer-token authentication (drf-spectacular finds extensions by
import; ``AccountsConfig.ready`` imports this module)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """``accounts.authentication.BearerTokenAuthentication`` as an HTTP bearer scheme."""

    target_class = "accounts.authentication.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token (plx_...) from POST /api/v1/auth/token/ or manage.py create_token.",
        }
