"""The API's one pagination (``REST_FRAMEWORK["DEFAULT_PAGINATION_CLASS"]``).

Its own module because DRF imports the pagination setting while ``rest_framework.generics`` is
still loading: a module that imports generic views (like ``accounts.api``) cannot hold it.
"""

from rest_framework.pagination import PageNumberPagination


class StandardPagination(PageNumberPagination):
    """Every list of the API: ``?page=N``, 50 items a page, ``?page_size=`` up to 200."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200
