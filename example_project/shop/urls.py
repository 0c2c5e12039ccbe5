"""The shop's pages (see views.py)."""

from django.urls import path

from . import views

app_name = "shop"

urlpatterns = [
    path("", views.index, name="index"),
    path("orders/", views.place_order, name="place_order"),
    path("orders/<int:pk>/", views.order_detail, name="order"),
    path("orders/<int:pk>/progress/", views.order_progress, name="order_progress"),
    path("orders/<int:pk>/steps/", views.order_steps, name="order_steps"),
    path("orders/<int:pk>/approve/", views.approve_payment, name="approve_payment"),
    path("orders/<int:pk>/cancel/", views.cancel, name="cancel"),
]
