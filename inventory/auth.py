"""Bearer-token authentication (tokens are defined in inventory.models)."""
from rest_framework.authentication import BaseAuthentication


class BearerTokenAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        return None

    def authenticate_header(self, request):
        return self.keyword
