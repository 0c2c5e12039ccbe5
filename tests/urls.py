from django.contrib import admin
from django.http import HttpRequest, StreamingHttpResponse
from django.urls import include, path

from selvedge_django.streams import event_stream_response


def stream_events(request: HttpRequest, instance_id: str, key: str) -> StreamingHttpResponse:
    """A stream as Server-Sent Events, from a sync view (tests/integration/test_streams.py)."""
    return event_stream_response(request, instance_id, key)


async def astream_events(request: HttpRequest, instance_id: str, key: str) -> StreamingHttpResponse:
    """The same from an async view."""
    return event_stream_response(request, instance_id, key)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("selvedge/", include("selvedge_django.urls")),
    path("streams/<str:instance_id>/<str:key>/", stream_events),
    path("astreams/<str:instance_id>/<str:key>/", astream_events),
]
