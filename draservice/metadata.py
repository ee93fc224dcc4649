"""``OPTIONS`` on every route: DRF's SimpleMetadata, minus its assumption that a generic view has a
serializer.

The claims and gangs views render Kubernetes objects with plain functions and have no ``serializer_class``;
SimpleMetadata then fails (AssertionError, a 500) while describing the POST/PUT form. Those views answer
what DRF answers for any view without a serializer: name, description, renders and parses.
"""
from rest_framework.metadata import SimpleMetadata


class Metadata(SimpleMetadata):
    def determine_actions(self, request, view):
        if hasattr(view, "get_serializer_class"):
            try:
                view.get_serializer_class()
            except AssertionError:  # GenericAPIView's way of saying "no serializer_class"
                return {}
        return super().determine_actions(request, view)
